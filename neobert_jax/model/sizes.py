"""The sizes the architecture derives from the model section (head size, the SwiGLU width) and their FLOPs per token
(the one home of the MFU formula)."""

import math

import ml_collections


def head_dim(cfg: ml_collections.ConfigDict) -> int:
  return cfg.hidden_size // cfg.num_heads


def ffn_hidden_size(cfg: ml_collections.ConfigDict) -> int:
  """SwiGLU keeps the FFN's parameter count of a 4x GELU MLP: 2/3 of the configured size, rounded up to 8."""
  return 8 * math.ceil(int(2 * cfg.intermediate_size / 3) / 8)


def matmul_params(cfg: ml_collections.ConfigDict, decoder_fraction: float = 1.0) -> float:
  """Parameters in a matmul per token; decoder_fraction scales the MLM decoder when it runs on masked slots only."""
  d, f = cfg.hidden_size, ffn_hidden_size(cfg)
  per_layer = d * 3 * d + d * d + d * 2 * f + f * d
  return cfg.num_layers * per_layer + decoder_fraction * d * cfg.vocab_size


def train_flops_per_token(cfg: ml_collections.ConfigDict, seq_len: int, decoder_fraction: float = 1.0) -> float:
  """6 x matmul parameters + attention scores and values (forward + backward), the usual MFU convention."""
  return 6 * matmul_params(cfg, decoder_fraction) + 12 * cfg.num_layers * seq_len * cfg.hidden_size
