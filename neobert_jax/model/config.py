"""Model hyper-parameters: an ml-collections ConfigDict whose defaults are the released NeoBERT (250M).

Only architecture and numerics live here; data, optimizer and mesh settings belong to the training config.
"""

from __future__ import annotations

import math

import jax
import ml_collections

from neobert_jax.model.attention.select import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
REMAT_POLICIES = ("none", "full", "save_dots")
DTYPES = ("float32", "bfloat16", "float16")
# model.dtype may also be 'auto': bf16 compute on accelerators, fp32 on CPU (resolve_dtype).
COMPUTE_DTYPES = ("auto",) + DTYPES


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
  cfg.param_dtype = "float32"  # master weights
  # Compute dtype of matmuls and activations: the one compute-dtype setting (MaxText's `dtype`, Flax's `dtype` next
  # to `param_dtype`). A model built from this config directly computes in fp32; the training and fine-tuning
  # schemas default to 'auto', which resolve_dtype turns into bfloat16 on GPU/TPU and float32 on CPU.
  cfg.dtype = "float32"
  # Attention kernel: 'auto' | 'xla' | 'blockwise' | 'cudnn' | 'cudnn_bias' | 'splash'. 'auto' takes the fastest
  # correct one for the backend, compute dtype and packing (the table in model/attention/select.py) and the
  # trainer logs the choice at start-up.
  cfg.attention_impl = "auto"
  cfg.splash_block_size = 512  # TPU splash tiles (query and key), a multiple of 128
  cfg.blockwise_block_size = 128  # key block of the 'blockwise' kernel
  cfg.scan_layers = True  # one compiled block for all layers (compile time independent of depth)
  cfg.remat_policy = "none"
  return cfg


def head_dim(cfg: ml_collections.ConfigDict) -> int:
  return cfg.hidden_size // cfg.num_heads


def ffn_hidden_size(cfg: ml_collections.ConfigDict) -> int:
  """SwiGLU keeps the FFN's parameter count of a 4x GELU MLP: 2/3 of the configured size, rounded up to 8."""
  return 8 * math.ceil(int(2 * cfg.intermediate_size / 3) / 8)


def resolve_dtype(name: str, platform: str | None = None) -> str:
  """The concrete compute dtype for model.dtype on `platform` (default: this process's backend).

  The only place 'auto' is resolved: the trainer (train/config.resolve), fine-tuning and the AOT command (for its
  target's platform) all call this, so they agree. fp32 master weights stay in param_dtype either way.
  """
  if name != "auto":
    return name
  return "float32" if (platform or jax.default_backend()) == "cpu" else "bfloat16"


def validate_model_config(cfg: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field and the fix for configurations the model cannot run."""
  if cfg.hidden_size % cfg.num_heads:
    raise ValueError(
        f"model.hidden_size={cfg.hidden_size} is not divisible by model.num_heads={cfg.num_heads}; "
        "choose sizes so that the head dimension is an integer.")
  if head_dim(cfg) % 2:
    raise ValueError(f"head dimension {head_dim(cfg)} must be even for rotary embeddings.")
  if cfg.attention_impl not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"model.attention_impl={cfg.attention_impl!r}; expected one of {ATTENTION_IMPLEMENTATIONS}.")
  if cfg.remat_policy not in REMAT_POLICIES:
    raise ValueError(f"model.remat_policy={cfg.remat_policy!r}; expected one of {REMAT_POLICIES}.")
  if cfg.splash_block_size <= 0 or cfg.splash_block_size % 128:
    raise ValueError(f"model.splash_block_size={cfg.splash_block_size} must be a positive multiple of 128.")
  if cfg.blockwise_block_size <= 0:
    raise ValueError(f"model.blockwise_block_size={cfg.blockwise_block_size} must be positive.")
  if cfg.dtype not in COMPUTE_DTYPES:
    raise ValueError(f"model.dtype={cfg.dtype!r}; expected one of {COMPUTE_DTYPES}.")
  if cfg.param_dtype not in DTYPES:
    raise ValueError(f"model.param_dtype={cfg.param_dtype!r}; expected one of {DTYPES}.")
  if cfg.attention_impl in ("cudnn", "cudnn_bias") and cfg.dtype == "float32":
    raise ValueError(f"model.attention_impl={cfg.attention_impl!r} needs model.dtype='bfloat16' or 'float16' "
                     "(cuDNN fused attention has no fp32 kernel); use 'auto' or 'xla' for fp32.")
  for field in ("vocab_size", "num_layers", "intermediate_size", "max_length"):
    if cfg[field] <= 0:
      raise ValueError(f"model.{field}={cfg[field]} must be positive.")


def matmul_params(cfg: ml_collections.ConfigDict, decoder_fraction: float = 1.0) -> float:
  """Parameters that take part in a matmul per token (embedding lookups are gathers, not matmuls).

  decoder_fraction scales the MLM decoder when it only runs on the masked positions (sparse head).
  """
  d, f = cfg.hidden_size, ffn_hidden_size(cfg)
  per_layer = d * 3 * d + d * d + d * 2 * f + f * d
  return cfg.num_layers * per_layer + decoder_fraction * d * cfg.vocab_size


def train_flops_per_token(cfg: ml_collections.ConfigDict, seq_len: int, decoder_fraction: float = 1.0) -> float:
  """6 x matmul parameters + attention scores and values (forward + backward), the usual MFU convention."""
  return 6 * matmul_params(cfg, decoder_fraction) + 12 * cfg.num_layers * seq_len * cfg.hidden_size


def remat_recompute_flops_per_token(cfg: ml_collections.ConfigDict, seq_len: int, policy: str) -> float:
  """Forward work the backward pass redoes under a remat policy, per token (the blocks only; the decoder is
  outside them).

  'save_dots' keeps the weight matmuls' outputs but not the attention score/value products (batched dots) nor the
  fused attention kernels, so attention's forward is recomputed; 'full' recomputes each block's whole forward.
  """
  attention_fwd = 4 * cfg.num_layers * seq_len * cfg.hidden_size
  if policy == "none":
    return 0.0
  if policy == "save_dots":
    return float(attention_fwd)
  if policy == "full":
    return 2 * matmul_params(cfg, decoder_fraction=0.0) + attention_fwd
  raise ValueError(f"model.remat_policy={policy!r}; expected one of {REMAT_POLICIES}.")
