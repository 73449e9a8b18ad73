"""The `model` section: architecture and numerics, with the released NeoBERT (250M) as defaults, and its validation.

Only architecture and numerics live here; data, optimizer and mesh settings belong to the run's config
(config/train.py, config/finetune.py). The allowed values of each choice field are named here too (the attention
table in model/attention/select.py reads ATTENTION_IMPLEMENTATIONS from here). What the architecture derives from
this section (head_dim, ffn_hidden_size, the compute dtype 'auto' resolves to, the FLOP count) is the model's:
neobert_jax/model/config.py. Imports nothing of ours: model/ builds on it.
"""

from __future__ import annotations

import ml_collections

ATTENTION_IMPLEMENTATIONS = ('auto', 'xla', 'blockwise', 'cudnn', 'cudnn_bias', 'splash')
REMAT_POLICIES = ('none', 'full', 'save_dots')
DTYPES = ('float32', 'bfloat16', 'float16')
# model.dtype may also be 'auto': bf16 compute on accelerators, fp32 on CPU (model/config.resolve_dtype).
COMPUTE_DTYPES = ('auto',) + DTYPES


def default_model_config() -> ml_collections.ConfigDict:
  """The chandar-lab/NeoBERT architecture (28 x 768, SwiGLU 2048, RoPE, pre-RMSNorm)."""
  cfg = ml_collections.ConfigDict()
  cfg.vocab_size = 30522  # bert-base-uncased WordPiece
  cfg.hidden_size = 768
  cfg.num_layers = 28
  cfg.num_heads = 12
  # The *configured* FFN size, as in the published config.json; the SwiGLU hidden size is derived from it
  # (ffn_hidden_size) exactly as NeoBERT does, so 3072 gives the 2048-wide gate and up projections.
  cfg.intermediate_size = 3072
  cfg.norm_eps = 1e-5
  cfg.rope_theta = 10000.0
  cfg.max_length = 1024
  cfg.pad_token_id = 0
  cfg.embedding_init_range = 0.02
  cfg.decoder_init_range = 0.02
  cfg.param_dtype = 'float32'  # master weights
  # Compute dtype of matmuls and activations: the one compute-dtype setting (MaxText's `dtype`, Flax's `dtype` next
  # to `param_dtype`). A model built from this config directly computes in fp32; the training and fine-tuning
  # schemas default to 'auto', which resolve_dtype turns into bfloat16 on GPU/TPU and float32 on CPU.
  cfg.dtype = 'float32'
  # Attention kernel: 'auto' | 'xla' | 'blockwise' | 'cudnn' | 'cudnn_bias' | 'splash'. 'auto' takes the fastest
  # correct one for the backend, compute dtype and packing (the table in model/attention/select.py) and the
  # trainer logs the choice at start-up.
  cfg.attention_impl = 'auto'
  cfg.splash_block_size = 512  # TPU splash tiles (query and key), a multiple of 128
  cfg.blockwise_block_size = 128  # key block of the 'blockwise' kernel
  cfg.scan_layers = True  # one compiled block for all layers (compile time independent of depth)
  cfg.remat_policy = 'none'
  return cfg


def validate_model_config(cfg: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field and the fix for configurations the model cannot run."""
  if cfg.hidden_size % cfg.num_heads:
    raise ValueError(
      f'model.hidden_size={cfg.hidden_size} is not divisible by model.num_heads={cfg.num_heads}; '
      'choose sizes so that the head dimension is an integer.'
    )
  head_dim = cfg.hidden_size // cfg.num_heads
  if head_dim % 2:
    raise ValueError(f'head dimension {head_dim} must be even for rotary embeddings.')
  if cfg.attention_impl not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f'model.attention_impl={cfg.attention_impl!r}; expected one of {ATTENTION_IMPLEMENTATIONS}.')
  if cfg.remat_policy not in REMAT_POLICIES:
    raise ValueError(f'model.remat_policy={cfg.remat_policy!r}; expected one of {REMAT_POLICIES}.')
  if cfg.splash_block_size <= 0 or cfg.splash_block_size % 128:
    raise ValueError(f'model.splash_block_size={cfg.splash_block_size} must be a positive multiple of 128.')
  if cfg.blockwise_block_size <= 0:
    raise ValueError(f'model.blockwise_block_size={cfg.blockwise_block_size} must be positive.')
  if cfg.dtype not in COMPUTE_DTYPES:
    raise ValueError(f'model.dtype={cfg.dtype!r}; expected one of {COMPUTE_DTYPES}.')
  if cfg.param_dtype not in DTYPES:
    raise ValueError(f'model.param_dtype={cfg.param_dtype!r}; expected one of {DTYPES}.')
  if cfg.attention_impl in ('cudnn', 'cudnn_bias') and cfg.dtype == 'float32':
    raise ValueError(
      f"model.attention_impl={cfg.attention_impl!r} needs model.dtype='bfloat16' or 'float16' "
      "(cuDNN fused attention has no fp32 kernel); use 'auto' or 'xla' for fp32."
    )
  for field in ('vocab_size', 'num_layers', 'intermediate_size', 'max_length'):
    if cfg[field] <= 0:
      raise ValueError(f'model.{field}={cfg[field]} must be positive.')
