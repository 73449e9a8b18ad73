"""Cutting input files into units of work for `prepare --engine=ray`: one 50 GB file must not be one task.
Text/JSONL: byte ranges (a line or paragraph belongs to one part); Parquet: runs of row groups; .zst: runs of
frames (seek table, or frame headers for local files). .gz, one-frame .zst and text_mode 'file' stay one unit."""

import sys
from typing import Sequence

import numpy as np

from neobert_jax import paths
from neobert_jax.data.prepare import sources

_ZSTD_MAGIC = 0xFD2FB528
_SEEKABLE_MAGIC = 0x8F92EAB1  # the last 4 bytes of a seekable-format .zst (zstd/contrib/seekable_format)


def _seek_table(f, size: int) -> list[tuple[int, int]] | None:
  """(compressed, decompressed) size of each frame, from a seekable .zst's seek table; None without one."""
  if size < 17:
    return None
  f.seek(size - 9)
  foot = f.read(9)
  if int.from_bytes(foot[5:], 'little') != _SEEKABLE_MAGIC:
    return None
  n, entry = int.from_bytes(foot[:4], 'little'), 12 if foot[4] & 0x80 else 8
  f.seek(size - 9 - n * entry)
  table = f.read(n * entry)
  frames = [
    (int.from_bytes(table[i : i + 4], 'little'), int.from_bytes(table[i + 4 : i + 8], 'little'))
    for i in range(0, n * entry, entry)
  ]
  return frames if sum(c for c, _ in frames) + 8 + n * entry + 9 == size else None


def _walk_frames(f, size: int) -> list[tuple[int, int]] | None:
  """(compressed, decompressed) size of each frame from the headers; None when a frame does not state its size."""
  import zstandard  # pylint: disable=g-import-not-at-top

  out, pos = [], 0
  while pos < size:
    f.seek(pos)
    head = f.read(18)
    magic = int.from_bytes(head[:4], 'little')
    if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame (a seek table, metadata): no text
      pos += 8 + int.from_bytes(head[4:8], 'little')
      continue
    if magic != _ZSTD_MAGIC:
      return None
    params = zstandard.get_frame_parameters(head)
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
      return None
    start, pos = pos, pos + zstandard.frame_header_size(head)
    last = False
    while not last:
      f.seek(pos)
      block = int.from_bytes(f.read(3), 'little')
      last, kind, length = block & 1, (block >> 1) & 3, block >> 3
      pos += 3 + (1 if kind == 1 else length)  # an RLE block stores one byte
    pos += 4 if params.has_checksum else 0
    out.append((pos - start, params.content_size))
  return out if pos == size else None  # headers that do not add up: not cut (the reader reports the damage)


def _runs(sizes: list[int], split_bytes: int) -> list[tuple[int, int]]:
  """[first, end) runs of consecutive items, each closed by the item that brings it to `split_bytes`."""
  runs, first, total = [], 0, 0
  for i, size in enumerate(sizes):
    total += size
    if total >= split_bytes and i + 1 < len(sizes):
      runs.append((first, i + 1))
      first, total = i + 1, 0
  return runs + [(first, len(sizes))]


def _zstd_spans(path: str, size: int, split_bytes: int) -> list[sources.Span] | None:
  try:
    with sources.open_file(path) as f:
      frames = _seek_table(f, size)
      if frames is None and not paths.is_url(path):
        frames = _walk_frames(f, size)
  except Exception:  # noqa: BLE001 - a damaged file is one unit: its reader reports it as the local path does
    return []
  if not frames or len(frames) < 2:
    return None
  seek, at = np.cumsum([[0, 0]] + frames, axis=0).T.tolist()  # each frame's start, stored and decompressed
  spans = [sources.Span(at[a], at[b], seek[a]) for a, b in _runs([c for c, _ in frames], split_bytes)]
  return spans if len(spans) > 1 else None


def _parquet_spans(path: str, split_bytes: int) -> list[sources.Span] | None:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  try:
    with sources.open_file(path) as f:
      meta = pq.ParquetFile(f).metadata
  except Exception:  # noqa: BLE001 - an unreadable file is one unit: its reader reports it as the local path does
    return []
  groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
  rows = np.cumsum([0] + [g.num_rows for g in groups]).tolist()  # each group's first row
  spans = [sources.Span(a, b, row=rows[a]) for a, b in _runs([g.total_byte_size for g in groups], split_bytes)]
  return spans if len(spans) > 1 else None


def plan(
  files: Sequence[str], split_bytes: int, text_mode: str = 'line'
) -> tuple[list[tuple[str, sources.Span | None]], dict[str, int]]:
  """The units of `files` in reading order, and each file's size. A file that cannot be cut is one unit, with a
  warning when it is larger than `split_bytes`, except when it looks damaged (its reader says so, as locally)."""
  units, sizes = [], {}
  for path in files:
    fmt, comp = sources.split_ext(path)
    size = sizes[path] = paths.Path(path).stat().length
    spans = None
    if size > split_bytes and not (fmt == 'text' and text_mode == 'file'):
      if fmt == 'parquet':
        spans = _parquet_spans(path, split_bytes)
      elif fmt and not comp:  # byte ranges of about split_bytes each
        n = max(1, -(-size // split_bytes))
        cuts = [size * k // n for k in range(n + 1)]
        spans = [sources.Span(a, b, a) for a, b in zip(cuts[:-1], cuts[1:])]
      elif comp in ('.zst', '.zstd'):
        spans = _zstd_spans(path, size, split_bytes)
      if spans is None and fmt:
        why = _why_whole(path, comp)
        print(f'prepare: warning: {path} ({size / 2**20:.0f} MiB) is read by one task: {why}', file=sys.stderr)
    units += [(path, s) for s in spans] if spans else [(path, None)]
  return units, sizes


def _why_whole(path: str, comp: str) -> str:
  if comp == '.gz':
    return (
      'a gzip stream cannot be entered mid-file; split the file, or recompress it as zstd in frames '
      '(e.g. pzstd, or a seekable .zst)'
    )
  if comp:
    where = 'a bucket object needs a seek table (seekable format) to be' if paths.is_url(path) else 'it cannot be'
    return (
      f'{where} cut into frames (one frame, or frames that do not state their size); compress it in '
      'frames (pzstd, or a seekable .zst)'
    )
  return 'it has a single row group; write it with smaller row groups'
