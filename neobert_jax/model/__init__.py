"""NeoBERT model: config, attention, rotary embeddings, encoder and MLM head.

Owns the architecture and its parameter names. Reading and writing parameters (flat io, Orbax runs, the Hugging
Face layout) is the weights layer's (neobert_jax/weights/), which builds on this package. Must not import
weights/, train/, convert/, data/ or anything above them: they build on the model, never the reverse.
"""

from neobert_jax.config.model import default_model_config
from neobert_jax.model.sizes import ffn_hidden_size, head_dim, train_flops_per_token
from neobert_jax.model.encoder import NeoBERT, NeoBERTForMLM

__all__ = ['NeoBERT', 'NeoBERTForMLM', 'default_model_config', 'ffn_hidden_size', 'head_dim', 'train_flops_per_token']
