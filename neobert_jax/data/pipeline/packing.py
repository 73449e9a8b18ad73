"""Packing a block of documents (`tokens` concatenated, int32, and their `lengths`) into [rows, seq_len] int32 rows
(batch.py's input_ids, segment_ids, positions). Grain's packers copy tokens per element (~0.3M tokens/s); here only
the placement is decided per document and every token moves in one vectorised scatter.
"""

import numpy as np


def split_long(lengths: np.ndarray, seq_len: int) -> np.ndarray:
  """Cuts documents longer than seq_len into consecutive pieces of seq_len: only the lengths change."""
  lengths = np.asarray(lengths, np.int64)
  if lengths.size == 0 or lengths.max() <= seq_len:
    return lengths
  pieces = np.maximum((lengths + seq_len - 1) // seq_len, 1)
  out = np.full(int(pieces.sum()), seq_len, np.int64)
  last = np.cumsum(pieces) - 1
  out[last] = lengths - (pieces - 1) * seq_len
  return out


def first_fit_decreasing(
  lengths: np.ndarray, seq_len: int, max_docs: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """(row, offset, 1-based slot, each indexed like `lengths`; n_rows): longest first, each document into the first
  row with room and, when max_docs > 0, fewer than max_docs documents (attention kernels' static per-row limit)."""
  n = lengths.size
  row, offset, slot = np.empty((3, n), np.int64)
  order = np.argsort(-lengths, kind='stable')
  # Documents that fill a row alone never share it: no search needed.
  n_full = int(np.count_nonzero(lengths == seq_len))
  full = order[:n_full]
  row[full] = np.arange(n_full)
  offset[full] = 0
  slot[full] = 1
  free, count = np.empty((2, n), np.int64)  # each open row's remaining room, and the documents already in it
  n_open = 0
  for i in order[n_full:].tolist():
    need = lengths[i]
    fits = free[:n_open] >= need
    if max_docs > 0:
      fits &= count[:n_open] < max_docs
    r = int(fits.argmax()) if n_open else 0
    if not n_open or not fits[r]:
      r = n_open
      free[r], count[r] = seq_len, 0
      n_open += 1
    offset[i] = seq_len - free[r]
    free[r] -= need
    count[r] += 1
    slot[i] = count[r]
    row[i] = n_full + r
  return row, offset, slot, n_full + n_open


def pack_block(
  tokens: np.ndarray,
  lengths: np.ndarray,
  seq_len: int,
  mode: str,
  pad_id: int,
  rng: np.random.Generator | None = None,
  max_docs: int = 0,
) -> dict:
  """Rows for one block: mode 'packed' (first-fit decreasing, at most max_docs documents per row when > 0) or
  'none'. With an rng the rows come out in random order, so batches are not sorted by document length."""
  lengths = split_long(lengths, seq_len)
  if mode == 'packed':
    row, offset, slot, n_rows = first_fit_decreasing(lengths, seq_len, max_docs)
  elif mode == 'none':
    n_rows = lengths.size
    row = np.arange(n_rows, dtype=np.int64)
    offset = np.zeros(n_rows, np.int64)
    slot = np.ones(n_rows, np.int64)
  else:
    raise ValueError(f"packing mode must be 'packed' or 'none', got {mode!r}")
  if rng is not None:
    row = rng.permutation(n_rows)[row]  # shuffle rows by renaming them: no copy
  within = np.arange(tokens.size, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  dest = np.repeat(row * seq_len + offset, lengths) + within
  ids = np.full(n_rows * seq_len, pad_id, np.int32)
  seg = np.zeros(n_rows * seq_len, np.int32)
  pos = np.zeros(n_rows * seq_len, np.int32)
  ids[dest] = tokens
  seg[dest] = np.repeat(slot, lengths)
  pos[dest] = within
  shape = (n_rows, seq_len)
  return {'input_ids': ids.reshape(shape), 'segment_ids': seg.reshape(shape), 'positions': pos.reshape(shape)}
