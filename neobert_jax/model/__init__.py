"""NeoBERT model: config, attention, rotary embeddings, encoder and MLM head, flat parameter io, and the Hugging Face
layout of those parameters (hf_layout.py: the mapping and checkpoint reading that train/ and convert/ share).

Owns the architecture and its parameter names. Must not import train/, convert/, data/ or anything above them:
the trainer, the converter and the downstream commands build on the model, never the reverse.
"""

from neobert_jax.model.config import default_model_config, ffn_hidden_size, head_dim, train_flops_per_token
from neobert_jax.model.encoder import NeoBERT, NeoBERTForMLM
from neobert_jax.model.params import load_flat, to_flat

__all__ = ["NeoBERT", "NeoBERTForMLM", "default_model_config", "ffn_hidden_size", "head_dim", "load_flat",
           "to_flat", "train_flops_per_token"]
