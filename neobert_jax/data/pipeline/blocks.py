"""Which documents form block b: per-process share, per-epoch shuffle, repeat,
read in one batched call.

Reading documents one by one through Grain's per-element MapDataset chain costs
~250 us each here (ArrayRecord dispatches every single read to its thread
pool); one batched `__getitems__` per block costs ~15 us per document. So the
share/shuffle/repeat steps are done on index arrays, and a block of documents
is read at once.

The shuffle is a seeded bijection of [0, n) (a Feistel network with cycle
walking), evaluated only at the indices needed: no per-epoch permutation table,
so memory does not grow with the corpus and any block is computed directly.
"""

import functools
import sys

import grain
import numpy as np

_ROUNDS = 6
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


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


class DocumentBlocks(grain.MapDataset):
  """Element b = (ids, lengths) of block b of this process's document stream.

  Training (shuffle=True): an endless stream; position j of it is epoch
  j // n_local, document permute(j % n_local) of this process's share
  {process_index + k * process_count}. Blocks run across epoch boundaries.
  Eval (shuffle=False): the share once, in order.
  """

  def __init__(
    self, source, block_docs: int, *, seed: int, process_index: int, process_count: int, shuffle: bool, id_dtype
  ):
    super().__init__()
    self._source, self._dtype = source, id_dtype
    self._block = block_docs
    self._seed, self._shuffle = seed, shuffle
    self._pi, self._pc = process_index, process_count
    self._n_local = len(range(process_index, len(source), process_count))
    if self._n_local == 0:
      raise ValueError(f'{len(source)} records cannot feed {process_count} processes')

  def __len__(self) -> int:
    if self._shuffle:
      return sys.maxsize
    return -(-self._n_local // self._block)

  def __str__(self) -> str:
    return f'DocumentBlocks(block={self._block}, process={self._pi}/{self._pc}, shuffle={self._shuffle})'

  def local_indices(self, block: int) -> np.ndarray:
    """This process's document numbers (0..n_local-1) in block `block`."""
    if self._shuffle:
      j = np.arange(block * self._block, (block + 1) * self._block, dtype=np.int64)
      epoch, within = np.divmod(j, self._n_local)
      out = np.empty_like(j)
      for e in np.unique(epoch).tolist():  # a block spans at most a few epochs
        sel = epoch == e
        out[sel] = permute(within[sel], self._n_local, self._seed, e)
      return out
    block %= len(self)  # Grain's convention: an index past the end is a later epoch
    return np.arange(block * self._block, min((block + 1) * self._block, self._n_local))

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    records = self._pi + self.local_indices(index) * self._pc
    return join_records(self._source.__getitems__(records.tolist()), self._dtype)
