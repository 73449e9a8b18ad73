"""One host's batches of one prepared source, and their position: every step, B/V rows from each of the host's
virtual shards, in shard order.

Of n processes, process p owns virtual shards [p*V/n, (p+1)*V/n) and builds only its own rows: B/n per step. The
rows of global step k (process 0's, then 1's, ...) are the same for every n that divides V, because each virtual
shard gives B/V rows to every step whoever owns it. The iterator state is, per owned virtual shard, the next block
and row (two integers): restoring is a seek (one block rebuilt per shard), not a replay, and the states of the
processes of any earlier run merge into one table (position.py) from which every process of the new run takes its own.
"""

import json
from typing import Any

import grain
import numpy as np

from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import virtual


class HostBatches(grain.IterDataset):
  """Every step, `rows_per_shard` rows from each of the given virtual shards' row streams, concatenated in order.

  `blocks` maps a virtual shard's number to its MapDataset of built blocks (dicts of [rows, T] arrays). A slice
  (set by mp_prefetch: worker w of W) makes each stream use blocks w, w + W, ... of its shard.
  """

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
