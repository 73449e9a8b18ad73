"""Batched forward passes over many sequences: one jitted function over length-sorted static-shape buckets, results
scattered back to input order."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax.downstream import batching
from neobert_jax.sharding import MeshBound


def jit_forward(model_def: Any, param_shardings: Any, mesh: jax.sharding.Mesh) -> Callable:
  """Jitted (params, input_ids [B, T], lengths [B]) -> model output, replicated for the host to read."""
  data = batching.row_sharding(mesh)

  def forward(params, input_ids, lengths):
    return nnx.merge(model_def, params)(input_ids, lengths)

  return MeshBound(
    mesh, jax.jit(forward, in_shardings=(param_shardings, data, data), out_shardings=NamedSharding(mesh, P()))
  )


def run_batched(
  forward: Callable,
  params: Any,
  seqs: Sequence[np.ndarray],
  batch_size: int,
  bucket_list: Sequence[int],
  pad_id: int,
  mesh: jax.sharding.Mesh,
  progress: Any = None,
) -> np.ndarray:
  """forward over all sequences (batch_size rows each, static bucket shapes); [N, ...] float32 in input order."""
  out = None
  for batch in batching.epoch_batches(seqs, {}, batch_size, bucket_list, pad_id, rng=None):
    g = batching.shard_rows({'input_ids': batch['input_ids'], 'lengths': batch['lengths']}, mesh)
    result = np.asarray(forward(params, g['input_ids'], g['lengths']), np.float32)
    real = batch['index'] >= 0
    if out is None:
      out = np.zeros((len(seqs),) + result.shape[1:], np.float32)
    out[batch['index'][real]] = result[real]
    if progress is not None:
      progress.update(int(real.sum()))
  return out if out is not None else np.zeros((0,), np.float32)
