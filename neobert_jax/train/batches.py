"""Host batches (numpy, this process's rows) -> global jax.Arrays laid out for the train / eval step.

Each process reads its own rows; `jax.make_array_from_process_local_data` stitches them into one global array
sharded over the mesh's batch axes, so nothing is ever copied between hosts. Rows are split into micro-batches on
the host ([B_local, ...] -> [A, B_local / A, ...]), which keeps every device's slice of every micro-batch local.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

import jax
import numpy as np

from neobert_jax.data.pipeline import masking
from neobert_jax.engine.step import micro_batch_sharding
from neobert_jax.train.mlm import batch_keys


def stitch_micro_batches(
  batch: Mapping[str, np.ndarray], keys: tuple[str, ...], mesh: jax.sharding.Mesh, accum: int
) -> dict[str, jax.Array]:
  """[B_local, ...] host arrays -> {key: global [accum, B_global / accum, ...] array}."""
  sharding = micro_batch_sharding(mesh)
  nproc = jax.process_count()
  out = {}
  for k in keys:
    if k not in batch:
      raise KeyError(f'the data pipeline gave no {k!r} (has {sorted(batch)}); check data.max_predictions')
    local = np.asarray(batch[k])
    if local.shape[0] % accum:
      raise ValueError(f'{local.shape[0]} local rows do not split into {accum} micro-batches')
    local = local.reshape((accum, local.shape[0] // accum) + local.shape[1:])
    global_shape = (accum, local.shape[1] * nproc) + local.shape[2:]
    out[k] = jax.make_array_from_process_local_data(sharding, local, global_shape)
  return out


class GlobalBatches:
  """Wraps a host iterator; yields (global arrays for the step, real tokens across all processes).

  `reads(step)`: how many host batches step `step` (0 = the first update) concatenates, in order (the batch-size
  warmup of config/ramp.py; one by default). `step` is the first step this iterator serves (a resumed run's).
  `keep(step)`: the share of masked tokens step `step` keeps (data.mask_rate_final: masking.thin, drawn from
  (seed, step, process)); None keeps them all."""

  def __init__(
    self,
    host_iter: Iterator[Mapping[str, np.ndarray]],
    max_predictions: int,
    mesh: jax.sharding.Mesh,
    accum: int,
    reads: Callable[[int], int] = lambda step: 1,
    step: int = 0,
    keep: Callable[[int], float] | None = None,
    seed: int = 0,
  ):
    self.host_iter, self.mesh, self.accum = host_iter, mesh, accum
    self.keys = batch_keys(max_predictions)
    self.reads, self.step, self.keep, self.seed = reads, step, keep, seed

  def __iter__(self) -> 'GlobalBatches':
    return self

  def _host_batch(self) -> Mapping[str, np.ndarray]:
    step, n = self.step, self.reads(self.step)
    self.step += 1
    parts = [next(self.host_iter) for _ in range(n)]
    batch = parts[0] if n == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if self.keep is None:
      return batch
    return masking.thin(dict(batch), self.keep(step), np.random.default_rng([self.seed, step, jax.process_index()]))

  def __next__(self) -> tuple[dict[str, jax.Array], int]:
    batch = self._host_batch()
    # Processes read equal-sized shards of similar documents, so local * count estimates the global figure
    # without a cross-host reduction on the hot path.
    return stitch_micro_batches(batch, self.keys, self.mesh, self.accum), int(
      np.count_nonzero(batch['segment_ids'])
    ) * jax.process_count()
