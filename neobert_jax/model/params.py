"""The model's parameters as a flat {dotted path: numpy array} dict: the layout converters and tools exchange.

Keys (layers stacked along a leading axis), e.g. 'encoder.layers.qkv' [L, D, H, 3*Dh].
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from flax import nnx

from neobert_jax import checkpoint_io


def _path_key(path) -> str:
  return ".".join(str(getattr(p, "key", p)) for p in path)


def to_flat(model: nnx.Module) -> dict[str, np.ndarray]:
  """Gathers every nnx.Param to host memory (fine for export; a sharded run restores on one CPU for that)."""
  state = nnx.state(model, nnx.Param)
  return {_path_key(path): np.asarray(jax.device_get(var[...])) for path, var in nnx.to_flat_state(state)}


def load_flat(model: nnx.Module, flat: Mapping[str, np.ndarray]) -> None:
  """Writes flat arrays into the model in place, keeping each parameter's dtype and sharding.

  Raises ValueError naming every missing or unexpected key and every shape mismatch, before anything changes.
  """
  state = nnx.state(model, nnx.Param)
  variables = {_path_key(path): var for path, var in nnx.to_flat_state(state)}
  checkpoint_io.check_keys_and_shapes(
      flat, {k: tuple(v[...].shape) for k, v in variables.items()}, 'the parameters',
      'check that the model config (layers, sizes, vocab) matches the checkpoint', error=ValueError)
  for key, var in variables.items():
    current = var[...]
    value = np.asarray(flat[key]).astype(current.dtype)
    var[...] = jax.device_put(value, current.sharding)
