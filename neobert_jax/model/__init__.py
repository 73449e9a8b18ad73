"""NeoBERT model: config, attention, rotary embeddings, encoder and MLM head. Must not import weights/, train/,
convert/, data/ or anything above them."""

from neobert_jax.config.model import default_model_config
from neobert_jax.model.sizes import ffn_hidden_size, head_dim, train_flops_per_token
from neobert_jax.model.encoder import NeoBERT, NeoBERTForMLM

__all__ = ['NeoBERT', 'NeoBERTForMLM', 'default_model_config', 'ffn_hidden_size', 'head_dim', 'train_flops_per_token']
