"""What the architecture derives from the model section: head size, the SwiGLU width, the compute dtype that
'auto' resolves to, and the FLOP count (the one home of the MFU formula).

The section itself (fields, defaults, validation) is the config's: neobert_jax/config/model.py.
"""

from __future__ import annotations

import math

import jax
import ml_collections

from neobert_jax.config.model import REMAT_POLICIES


def head_dim(cfg: ml_collections.ConfigDict) -> int:
  return cfg.hidden_size // cfg.num_heads


def ffn_hidden_size(cfg: ml_collections.ConfigDict) -> int:
  """SwiGLU keeps the FFN's parameter count of a 4x GELU MLP: 2/3 of the configured size, rounded up to 8."""
  return 8 * math.ceil(int(2 * cfg.intermediate_size / 3) / 8)


def resolve_dtype(name: str, platform: str | None = None) -> str:
  """The concrete compute dtype for model.dtype on `platform` (default: this process's backend).

  The only place 'auto' is resolved: the trainer (train/runtime.resolve), fine-tuning and the AOT command (for its
  target's platform) all call this, so they agree. fp32 master weights stay in param_dtype either way.
  """
  if name != 'auto':
    return name
  return 'float32' if (platform or jax.default_backend()) == 'cpu' else 'bfloat16'


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
  if policy == 'none':
    return 0.0
  if policy == 'save_dots':
    return float(attention_fwd)
  if policy == 'full':
    return 2 * matmul_params(cfg, decoder_fraction=0.0) + attention_fwd
  raise ValueError(f'model.remat_policy={policy!r}; expected one of {REMAT_POLICIES}.')
