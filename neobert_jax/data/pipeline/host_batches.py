"""One host's batches: every step, B/V rows from each of the host's virtual shards of a source, in shard order
(HostBatches), and the training batches drawn from the run's sources by the mixture's sampler (TrainBatches).

Why a step's rows do not depend on the process count: docs/pods.md. A source's state is, per owned virtual shard,
the next block and row, so restoring is a seek, not a replay.
"""

import json
import logging
from typing import Any, Collection

import grain
import numpy as np

from neobert_jax.data import mixture as mixture_lib
from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import virtual

log = logging.getLogger('neobert_jax.data')


class HostBatches(grain.IterDataset):
  """Every step, `rows_per_shard` rows from each virtual shard's MapDataset of built blocks (`blocks`), in order.
  A slice (set by mp_prefetch: worker w of W) makes each stream use blocks w, w + W, ... of its shard."""

  def __init__(self, blocks: dict[int, grain.MapDataset], rows_per_shard: int):
    super().__init__(list(blocks.values()))
    self.blocks, self.rows_per_shard = blocks, rows_per_shard
    self.block_slice = (0, 1)

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    del sequential_slice
    self.block_slice = (sl.start or 0, sl.step or 1)

  def __iter__(self):
    return _HostBatchIterator(self)


class _HostBatchIterator(grain.DatasetIterator):
  """State: {'stream', 'shards': {virtual shard: [next block, next row in it]}} (block numbers before slicing)."""

  def __init__(self, ds: HostBatches):
    super().__init__()
    self._ds = ds
    self._pos = {v: [0, 0] for v in ds.blocks}  # per shard: sliced block counter, row in it
    self._cache: dict[int, tuple[int, dict | None]] = {}
    self._exhausted = False

  def _block(self, v: int, k: int) -> dict | None:
    cached = self._cache.get(v)
    if cached is not None and cached[0] == k:
      return cached[1]
    start, step = self._ds.block_slice
    index = start + k * step
    blocks = self._ds.blocks[v]
    block = blocks[index] if index < len(blocks) else None
    self._cache[v] = (k, block)  # one block per shard alive, plus the one being cut
    return block

  def take(self, v: int, need: int) -> list[dict]:
    """The next `need` rows of virtual shard `v` (fewer where finite data ends), as views of its blocks."""
    parts, pos = [], self._pos[v]
    while need:
      block = self._block(v, pos[0])
      if block is None:
        break
      n = len(block['input_ids'])
      if pos[1] >= n:
        pos[0], pos[1] = pos[0] + 1, 0
        continue
      take = min(need, n - pos[1])
      parts.append({k: a[pos[1] : pos[1] + take] for k, a in block.items()})
      pos[1] += take
      need -= take
    return parts

  def __next__(self) -> dict:
    if self._exhausted:
      raise StopIteration
    parts = []
    for v in self._ds.blocks:
      got = self.take(v, self._ds.rows_per_shard)
      short = self._ds.rows_per_shard - sum(len(p['input_ids']) for p in got)
      if short:  # finite data (the held-out split) ran out in this shard: its last batch topped up
        self._exhausted = True
        if not (got or parts):
          raise StopIteration
        got.append(_loss_free_rows((got or parts)[0], short))
      parts += got
    # Copies, so a batch does not keep its blocks alive.
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def get_state(self) -> dict[str, Any]:
    start, step = self._ds.block_slice
    return {'stream': virtual.STREAM, 'shards': {str(v): [start + p[0] * step, p[1]] for v, p in self._pos.items()}}

  def set_state(self, state: dict[str, Any]) -> None:
    if state.get('stream') != virtual.STREAM:
      raise ValueError(f'not a {virtual.STREAM} state: {json.dumps(state)[:80]}')
    saved = state['shards']
    missing = [v for v in self._pos if str(v) not in saved]
    if missing:
      raise ValueError(f'the state holds no position for virtual shard(s) {missing[:4]}')
    start, step = self._ds.block_slice
    for v in self._pos:
      block, row = saved[str(v)]
      if (block - start) % step:
        raise ValueError(f"block {block} of virtual shard {v} is not one of this worker's ({start} + k * {step})")
      self._pos[v] = [(block - start) // step, int(row)]
    self._cache.clear()
    self._exhausted = False


def _loss_free_rows(like: dict, n: int) -> dict:
  """Filler rows that keep shapes static: real tokens (no empty attention), no loss."""
  idx = np.arange(n) % len(like['input_ids'])
  rows = {k: v[idx].copy() for k, v in like.items()}
  rows['labels'][:] = masking.IGNORE
  if 'mlm_weights' in rows:
    rows['mlm_weights'][:] = 0.0
  return rows


class TrainBatches(grain.IterDataset):
  """Each step's rows drawn from `sources` (name -> HostBatches). `records`: records per virtual shard (an epoch) and
  `block_docs`: documents per block, of each source; `fresh`: sources a restore leaves at their start."""

  def __init__(
    self,
    sources: dict[str, HostBatches],
    mix: mixture_lib.Mixture,
    seed: int,
    rows_per_slot: int,
    records: dict[str, int],
    block_docs: dict[str, int],
    fresh: Collection[str] = (),
  ):
    super().__init__(list(sources.values()))
    self.sources, self.mix, self.seed, self.rows = sources, mix, seed, rows_per_slot
    self.records, self.block_docs, self.fresh = records, block_docs, fresh

  def __iter__(self):
    return _TrainIterator(self)


class _TrainIterator(grain.DatasetIterator):
  """State: {'mixture': the sampler's state, 'sources': {name: that source's position}}."""

  def __init__(self, ds: TrainBatches):
    super().__init__()
    self._ds = ds
    self._its = {n: iter(hb) for n, hb in ds.sources.items()}
    self._slots = list(next(iter(ds.sources.values())).blocks)
    self._sampler = mixture_lib.Sampler(ds.mix, ds.seed, ds.rows, self._slots)
    self._epochs: dict[str, int] = {}

  def __next__(self) -> dict:
    order = self._sampler.next()
    names = self._ds.mix.names
    parts, grouped, offset = [], [], 0
    for v in self._slots:
      where = order[v]
      for i, need in enumerate(np.bincount(where, minlength=len(names)).tolist()):
        if need:  # the slot's rows grouped by source, in source order
          parts += self._its[names[i]].take(v, need)
      grouped.append(offset + np.argsort(where, kind='stable'))  # the slot's rows in that grouped order
      offset += len(where)
    self._note_epochs()
    grouped = np.concatenate(grouped)
    # One copy per key (so a batch does not keep its blocks alive): the grouped rows scattered to their places.
    out = {}
    for k in parts[0]:
      rows = np.concatenate([p[k] for p in parts])
      out[k] = np.empty_like(rows)
      out[k][grouped] = rows
    return out

  def _note_epochs(self) -> None:
    """Logs a source's next epoch: the first of this process's virtual shards of it to pass its last document."""
    if self._ds.mix.plain:
      return
    for name, it in self._its.items():
      block = max(b for b, _ in it.get_state()['shards'].values())
      epoch = block * self._ds.block_docs[name] // max(self._ds.records[name], 1)
      if epoch > self._epochs.get(name, 0):
        log.info('mixture source %r starts epoch %d (its documents again, reshuffled)', name, epoch + 1)
      self._epochs[name] = epoch

  def get_state(self) -> dict[str, Any]:
    return {'mixture': self._sampler.get_state(), 'sources': {n: it.get_state() for n, it in self._its.items()}}

  def set_state(self, state: dict[str, Any]) -> None:
    state = upgrade_state(state, self._ds.mix)
    if 'mixture' in state:
      self._sampler.set_state(state['mixture'], self._ds.fresh)
    saved = state['sources']
    if self._ds.mix.plain:  # its one source, whatever it was named
      saved = {self._ds.mix.names[0]: next(iter(saved.values()))}
    for n, it in self._its.items():
      if n in saved and n not in self._ds.fresh:
        it.set_state(saved[n])


def upgrade_state(state: dict[str, Any], mix: mixture_lib.Mixture) -> dict[str, Any]:
  """`state` in the present format: a position saved before sources had names (one source's {'stream', 'shards'})
  becomes the one source's, its sampler at its start; ValueError, saying why, for a mixture of several sources."""
  if not (isinstance(state, dict) and state.get('stream') == virtual.STREAM):
    return state
  if len(mix.sources) != 1:
    raise ValueError(
      f'the saved position is of one source (saved before sources had names), and {mix.where} has '
      f'{len(mix.sources)}: it cannot say where each of them stands'
    )
  return {'sources': {mix.names[0]: state}}
