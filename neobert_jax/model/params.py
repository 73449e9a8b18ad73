"""The model's parameters as a flat {dotted path: numpy array} dict: the layout converters and tools exchange.

Keys (layers stacked along a leading axis), e.g. 'encoder.layers.qkv' [L, D, H, 3*Dh].
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from flax import nnx


def _path_key(path) -> str:
  return ".".join(str(getattr(p, "key", p)) for p in path)


def to_flat(model: nnx.Module) -> dict[str, np.ndarray]:
  """Gathers every nnx.Param to host memory (fine for export; a sharded run restores on one CPU for that)."""
  state = nnx.state(model, nnx.Param)
  return {_path_key(path): np.asarray(jax.device_get(var[...])) for path, var in nnx.to_flat_state(state)}


def expected_shapes(model: nnx.Module) -> dict[str, tuple[int, ...]]:
  state = nnx.state(model, nnx.Param)
  return {_path_key(path): tuple(var[...].shape) for path, var in nnx.to_flat_state(state)}


def load_flat(model: nnx.Module, flat: Mapping[str, np.ndarray]) -> None:
  """Writes flat arrays into the model in place, keeping each parameter's dtype and sharding.

  Raises ValueError naming every missing or unexpected key and every shape mismatch, before anything changes.
  """
  state = nnx.state(model, nnx.Param)
  variables = {_path_key(path): var for path, var in nnx.to_flat_state(state)}
  missing = sorted(set(variables) - set(flat))
  unexpected = sorted(set(flat) - set(variables))
  wrong = [f"{k}: checkpoint {tuple(np.shape(flat[k]))} vs model {tuple(variables[k][...].shape)}"
           for k in sorted(set(variables) & set(flat)) if tuple(np.shape(flat[k])) != tuple(variables[k][...].shape)]
  problems = []
  if missing:
    problems.append(f"missing parameters {missing}")
  if unexpected:
    problems.append(f"unexpected parameters {unexpected}")
  if wrong:
    problems.append("shape mismatches " + "; ".join(wrong))
  if problems:
    raise ValueError("parameters do not fit the model: " + ". ".join(problems) +
                     ". Check that the model config (layers, sizes, vocab) matches the checkpoint.")
  for key, var in variables.items():
    current = var[...]
    value = np.asarray(flat[key]).astype(current.dtype)
    var[...] = jax.device_put(value, current.sharding)
