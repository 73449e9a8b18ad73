"""The pretraining config as it runs here: the choices left to run time, resolved once at start-up.

`resolve` fills in the compute dtype ('auto': model/config.resolve_dtype), the mesh sizes (-1: config/train.py's
mesh_shape) and the attention kernel (model/attention/select.py's table), and the result is what config.json
records. The schema and its validation are config/train.py's; this needs the model's kernel table, which the
config package sits below.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import ml_collections

from neobert_jax.config import train as config_lib
from neobert_jax.errors import ConfigError
from neobert_jax.model.attention import choose
from neobert_jax.model.config import resolve_dtype


def resolve(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy with the run-time choices filled in (compute dtype, mesh sizes, attention kernel), as written to
  config.json."""
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.model.dtype = resolve_dtype(cfg.model.dtype)
  out.mesh = ml_collections.ConfigDict(config_lib.mesh_shape(cfg))
  choice = attention_choice(out)
  out.model.attention_impl = choice.kernel
  if jax.process_index() == 0:
    logging.getLogger(__name__).info('attention kernel: %s', choice.describe())
    if choice.warning:
      logging.getLogger(__name__).warning('attention: %s', choice.warning)
  return out


def attention_choice(
  cfg: ml_collections.ConfigDict, platform: str | None = None, compute_capability: str | None = None
) -> Any:
  """The attention kernel this run uses (model/attention/select.py's table) for `platform` (default: this
  process's backend); raises ConfigError when an explicit model.attention_impl cannot run there."""
  if platform is None:
    platform = jax.default_backend()
    if platform == 'gpu':
      compute_capability = getattr(jax.devices()[0], 'compute_capability', None)
  m = cfg.model
  try:
    return choose(
      m.attention_impl,
      platform=platform,
      dtype=m.dtype,
      packed=cfg.data.packing == 'packed',
      seq_len=m.max_length,
      compute_capability=compute_capability,
      splash_block=m.splash_block_size,
      blockwise_block=m.blockwise_block_size,
    )
  except ValueError as e:
    raise ConfigError(str(e)) from None
