"""Virtual shards: how a split's records are dealt to hosts, and which records form block b of each share.

The layout is docs/pods.md's ("Virtual shards"). Every block is computed from its number (a seek costs one block,
never a replay) through a seeded bijection of [0, n) (`permute`, a Feistel network with cycle walking) evaluated
only where a block needs it, so no permutation table grows with the corpus. A block's records are read in one call
per file: one by one through Grain's per-element chain they cost ~250 us each, in one call ~15 us.
"""

import dataclasses
import functools
import math
import sys

import grain
import numpy as np

from neobert_jax import errors

STREAM = 'virtual-shards/1'  # marks an iterator state as positions in the virtual shards' streams
_ROUNDS = 6  # of the Feistel network (permute)


@dataclasses.dataclass(frozen=True)
class Piece:
  """Records [lo, hi) of shard file number `file` (its index in the split's manifest list)."""

  file: int
  lo: int
  hi: int

  @property
  def size(self) -> int:
    return self.hi - self.lo


def ranges(counts: list[int], parts: int) -> list[tuple[int, int]]:
  """[lo, hi) of each of `parts` near-equal contiguous ranges of sum(counts) records."""
  total = sum(counts)
  return [(total * k // parts, total * (k + 1) // parts) for k in range(parts)]


def pieces(counts: list[int], lo: int, hi: int) -> list[Piece]:
  """The parts of the shard files (record counts `counts`, in order) that records [lo, hi) cover."""
  out, start = [], 0
  for f, n in enumerate(counts):
    a, b = max(lo, start), min(hi, start + n)
    if a < b:
      out.append(Piece(f, a - start, b - start))
    start += n
  return out


def owned(virtual_shards: int, process_index: int, process_count: int) -> range:
  per = virtual_shards // process_count
  return range(process_index * per, (process_index + 1) * per)


def check_layout(virtual_shards: int, process_count: int, global_batch: int, records: int) -> None:
  """A one-line ConfigError saying why this layout (`virtual_shards` >= 1) cannot run, if it cannot."""
  if virtual_shards % process_count:
    raise errors.ConfigError(
      f'data.virtual_shards={virtual_shards} is not a multiple of the process count {process_count}: every process '
      f'owns the same number of virtual shards, so a run may use (and resume under) only a process count that '
      f'divides data.virtual_shards; run with such a count, or start a new run with another data.virtual_shards'
    )
  if global_batch % virtual_shards:
    raise errors.ConfigError(
      f'the global batch ({global_batch} rows) is not a multiple of data.virtual_shards={virtual_shards}: every '
      'virtual shard gives the same number of rows to each step; pick a data.virtual_shards that divides it'
    )
  if records < virtual_shards:
    raise errors.ConfigError(
      f'the split holds {records} records, fewer than data.virtual_shards={virtual_shards}; lower it'
    )


class ShardStream:
  """Record numbers of one virtual shard's endless shuffled stream (shuffle=True) or of one pass in order."""

  def __init__(self, parts: list[Piece], *, seed: int, shard: int, window: int, shuffle: bool):
    self.parts, self.shuffle = parts, shuffle
    self.n = sum(p.size for p in parts)
    self._key = (seed, shard)
    self.windows = [parts[i : i + window] for i in range(0, len(parts), window)]
    self.window_sizes = np.array([sum(p.size for p in w) for w in self.windows], np.int64)
    self._orders: dict[int, np.ndarray] = {}

  def _order(self, epoch: int) -> np.ndarray:
    """The windows in the order epoch `epoch` visits them (the last few epochs' kept: every block asks)."""
    order = self._orders.get(epoch)
    if order is None:
      w = len(self.windows)
      order = permute(np.arange(w), w, _seed(self._key), epoch) if self.shuffle else np.arange(w)
      if len(self._orders) >= 4:
        self._orders.pop(min(self._orders))
      self._orders[epoch] = order
    return order

  def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(window index, record offset within the window) of stream positions, after the shuffles."""
    epoch, within = np.divmod(positions, self.n)
    win, off = np.empty_like(positions), np.empty_like(positions)
    for e in np.unique(epoch).tolist():  # a block spans at most a few epochs
      sel = epoch == e
      order = self._order(e)
      ends = np.cumsum(self.window_sizes[order])
      k = np.searchsorted(ends, within[sel], side='right')
      w = order[k]
      o = within[sel] - (ends[k] - self.window_sizes[w])
      if self.shuffle:
        for wi in np.unique(w).tolist():
          s = w == wi
          o[s] = permute(o[s], int(self.window_sizes[wi]), _seed(self._key + (wi,)), e)
      win[sel], off[sel] = w, o
    return win, off

  def records_at(self, win: np.ndarray, off: np.ndarray) -> list[tuple[int, int]]:
    """(file, record) of each (window, offset) that `locate` gave."""
    out = []
    for w, o in zip(win.tolist(), off.tolist()):
      for p in self.windows[w]:
        if o < p.size:
          out.append((p.file, p.lo + o))
          break
        o -= p.size
    return out

  def first_window(self) -> int:
    return int(self._order(0)[0])

  def next_window(self, position: int) -> int:
    """The window the stream enters after the one holding `position` (the next epoch's first, after the last)."""
    epoch, within = divmod(int(position), self.n)
    order = self._order(epoch)
    k = int(np.searchsorted(np.cumsum(self.window_sizes[order]), within, side='right'))
    return int(order[k + 1]) if k + 1 < len(order) else int(self._order(epoch + 1)[0])

  def files_of_window(self, w: int) -> list[int]:
    return [p.file for p in self.windows[w]]


def _seed(key: tuple) -> int:
  return int(np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
  """A 64-bit integer hash (splitmix64 finaliser) of x ^ key; uint64 wraps."""
  z = (x ^ key) * np.uint64(0x9E3779B97F4A7C15)
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def permute(indices: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
  """Image of `indices` (all in [0, n)) under a permutation of [0, n) fixed by (seed, epoch)."""
  if n <= 1:
    return np.zeros_like(np.asarray(indices, np.int64))
  half = max(1, ((n - 1).bit_length() + 1) // 2)  # domain 4**half >= n, < 4n
  low = np.uint64((1 << half) - 1)
  keys = _keys(seed, epoch)

  def feistel(x):
    left, right = x >> np.uint64(half), x & low
    for k in keys:
      left, right = right, left ^ (_mix(right, k) & low)
    return (left << np.uint64(half)) | right

  with np.errstate(over='ignore'):
    x = feistel(np.asarray(indices, np.uint64))
    out_of_range = x >= np.uint64(n)
    while out_of_range.any():  # cycle walking: stays a bijection of [0, n)
      x[out_of_range] = feistel(x[out_of_range])
      out_of_range = x >= np.uint64(n)
  return x.astype(np.int64)


@functools.lru_cache(maxsize=4096)
def _keys(seed: int, epoch: int) -> tuple[np.uint64, ...]:
  """The round keys of (seed, epoch): a generator per call costs more than a small block's permutation."""
  return tuple(np.random.default_rng([seed, epoch, 0x5EED]).integers(0, 2**63, _ROUNDS, dtype=np.uint64))


def join_records(records, dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
  """Records (ids of width `dtype` each) -> (all ids concatenated, as int32; per-record lengths)."""
  dtype = np.dtype(dtype)
  lengths = np.fromiter((len(r) for r in records), np.int64, len(records)) // dtype.itemsize
  return np.frombuffer(b''.join(records), dtype).astype(np.int32, copy=False), lengths


class ShardBlocks(grain.MapDataset):
  """Element b = (ids, lengths) of block b of one virtual shard's stream, read through a shard store. Reading block b
  pins its windows' files, releases the earlier ones and prefetches the next window: at once when `ahead` is 1, else
  once the next block or `ahead` of the window reaches it (a mixture's source fetches by its weight, docs/data.md)."""

  def __init__(
    self,
    stream: ShardStream,
    store,
    names: list[str],
    block_docs: int,
    id_dtype,
    finite: bool = False,
    ahead: float = 1.0,
  ):
    super().__init__()
    self._stream, self._store, self._names, self._block = stream, store, names, block_docs
    self._dtype, self._finite, self._ahead = id_dtype, finite, ahead
    self._held: list[int] = []

  def __len__(self) -> int:
    return -(-self._stream.n // self._block) if self._finite else sys.maxsize

  def __str__(self) -> str:
    return f'ShardBlocks(records={self._stream.n}, block={self._block})'

  def _window_ahead(self, last: int) -> int:
    """The window to fetch ahead of a reader whose block ended at stream position `last` (see the class)."""
    if self._ahead >= 1 or len(self._stream.windows) == 1:
      return self._stream.next_window(last)
    win = self._stream.locate(np.array([last], np.int64))[0][0]
    span = max(self._block, math.ceil(self._ahead * int(self._stream.window_sizes[win])))
    return int(self._stream.locate(np.array([last + span], np.int64))[0][0])

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    if self._finite:
      index %= len(self)
    end = min((index + 1) * self._block, self._stream.n) if self._finite else (index + 1) * self._block
    pos = np.arange(index * self._block, end, dtype=np.int64)
    if not len(pos):
      return join_records([], self._dtype)
    win, off = self._stream.locate(pos)  # once: the shuffles are most of a block's bookkeeping
    files = [self._names[f] for w in dict.fromkeys(win.tolist()) for f in self._stream.files_of_window(w)]
    self._store.acquire(files)  # blocks until the block's files are local
    self._store.release(self._held)  # every acquire is matched by one release
    self._held = files
    if not self._finite or int(pos[-1]) + 1 < self._stream.n:  # downloads run ahead of the reader
      ahead = self._stream.files_of_window(self._window_ahead(int(pos[-1])))
      self._store.prefetch([self._names[f] for f in ahead if self._names[f] not in files])
    recs = self._stream.records_at(win, off)
    by_file: dict[int, list[int]] = {}
    for i, (f, _) in enumerate(recs):
      by_file.setdefault(f, []).append(i)
    out: list[bytes] = [b''] * len(recs)
    for f, idx in by_file.items():
      for i, rec in zip(idx, self._store.read(self._names[f], [recs[i][1] for i in idx])):
        out[i] = rec
    return join_records(out, self._dtype)
