"""Where each record of a shard lies in its file, so a reader on a bucket can fetch only the records it uses.

A host that reads a source of a mixture takes a share of its rows set by the weights. Fetching whole shard files
would make its bytes follow the files' sizes instead: a small source is one file, read whole at its first row.
With this index, a reader fetches each record it uses with one ranged read (data/pipeline/ranged.py).

Shards are written with group_size:1 and no compression (shards.WRITER_OPTIONS), so every record is its own riegeli
"simple" chunk that holds the record's bytes verbatim. A riegeli file is cut into 64 KiB blocks, each starting with
a 24-byte block header. Chunks follow one another across blocks: a 40-byte chunk header, then its data. A simple
chunk's data is a compression byte (0: none), the varint size of the sizes, the varint record sizes, then the
records. Block headers may fall inside a record, so a record is a byte span of the file minus the block headers
inside it.

The index holds where each record's chunk begins, and where the last one ends, stored as deflated chunk sizes: 1-2
bytes a record, under 1% of a shard of 128-token records. It is written beside the shard (`<shard>.index`) and listed in
the manifest with its size and sha256. A reader fetches a record's whole chunk and checks its layout (record_of),
so a range from the wrong place is an error, not a record of other ids. The chunk's own hash is riegeli's
HighwayHash, not checked here: the index is checked by sha256 and the shard by its size. The index is built from the
file just written and each record read back through record_of is checked against ArrayRecord's own reading, so a
layout this parser misreads never gives an index.
"""

from __future__ import annotations

import hashlib
import os
import zlib

from array_record.python.array_record_module import ArrayRecordReader
import numpy as np

from neobert_jax import errors

SUFFIX = '.index'
BLOCK, BLOCK_HEADER, CHUNK_HEADER = 1 << 16, 24, 40
SIMPLE_CHUNK, UNCOMPRESSED = ord('r'), 0


def name_of(shard_file: str) -> str:
  return shard_file + SUFFIX


def _usable(pos: int) -> int:
  """`pos`, moved past a block header that starts there."""
  return pos + BLOCK_HEADER if pos % BLOCK == 0 else pos


def end_of(offset: int, length: int) -> int:
  """The file position after `length` record bytes starting at `offset` (block headers inside counted)."""
  pos = offset
  while length > 0:
    pos = _usable(pos)
    take = min(BLOCK - pos % BLOCK, length)
    pos, length = pos + take, length - take
  return pos


def extract(blob: bytes, start: int, offset: int, length: int) -> bytes:
  """The `length` record bytes at file position `offset`, from `blob` (the file's bytes from position `start`)."""
  out, pos = [], offset
  while length > 0:
    pos = _usable(pos)
    take = min(BLOCK - pos % BLOCK, length)
    out.append(blob[pos - start : pos - start + take])
    pos, length = pos + take, length - take
  return b''.join(out)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    b = buf[i]
    value, shift, i = value | (b & 0x7F) << shift, shift + 7, i + 1
    if b < 0x80:
      return value, i


def _chunk_begins(data: bytes, records: int) -> np.ndarray:
  """Where the chunks of the first `records` records begin, and where the last one ends: records + 1 positions."""
  out = np.zeros(records + 1, np.int64)
  pos = n = 0
  while n < records:
    header = extract(data, 0, pos, CHUNK_HEADER)
    if len(header) < CHUNK_HEADER:
      raise ValueError(f'file ends after {n} of {records} records')
    data_size, kind, count = _fields(header)
    end = max(end_of(end_of(pos, CHUNK_HEADER), data_size), pos + count)  # riegeli's chunk end
    if kind == SIMPLE_CHUNK:
      out[n], out[n + 1] = pos, end
      n += 1
    pos = end
  return out


def _fields(header: bytes) -> tuple[int, int, int]:
  """(data size, chunk type, record count) of a chunk header."""
  return int.from_bytes(header[8:16], 'little'), header[24], int.from_bytes(header[25:32], 'little')


def record_of(blob: bytes, begin: int, end: int, where: str) -> bytes:
  """The record in the chunk that spans file positions [begin, end), from `blob` (the file's bytes from `begin`).

  Checks the chunk's layout (type, one record, uncompressed, sizes that add up to the span), so bytes from the wrong
  place or of another writer are a DataError naming `where`, never a record of garbage ids."""
  if len(blob) != end - begin:
    raise errors.DataError(f'{where}: a ranged read returned {len(blob)} of {end - begin} bytes; the file changed')
  header = extract(blob, begin, begin, CHUNK_HEADER)
  data_size, kind, count = _fields(header) if len(header) == CHUNK_HEADER else (0, 0, 0)
  body = end_of(begin, CHUNK_HEADER)
  if kind != SIMPLE_CHUNK or count != 1 or end_of(body, data_size) > end:
    raise errors.DataError(f'{where}: bytes {begin}-{end} are not one record chunk; the shard or its index is damaged')
  chunk = extract(blob, begin, body, data_size)
  if chunk[0] != UNCOMPRESSED:
    raise errors.DataError(f'{where}: the record chunk at byte {begin} is compressed; it was not written by prepare')
  sizes_size, i = _varint(chunk, 1)
  length, _ = _varint(chunk, i)
  record = chunk[i + sizes_size :]
  if len(record) != length or int.from_bytes(header[32:40], 'little') != length:
    raise errors.DataError(f'{where}: the record chunk at byte {begin} does not add up; the shard is damaged')
  return record


def build(path: str, records: int) -> np.ndarray:
  """The index of the shard at `path` (of `records` records): each record read back through `record_of` (what a
  ranged reader does) and checked against ArrayRecord's own reading."""
  with open(path, 'rb') as f:
    data = f.read()
  try:
    begins = _chunk_begins(data, records)
  except (ValueError, IndexError) as e:
    raise errors.DataError(f'{path}: cannot index its records ({e}); it was not written by prepare') from None
  reader = ArrayRecordReader(path)
  try:
    for lo in range(0, records, 4096):
      hi = min(lo + 4096, records)
      for i, rec in zip(range(lo, hi), reader.read(list(range(lo, hi)))):
        a, b = int(begins[i]), int(begins[i + 1])
        if record_of(data[a:b], a, b, path) != rec:
          raise errors.DataError(f'{path}: record {i} is not where its index says; it was not written by prepare')
  finally:
    reader.close()
  return begins


def encode(begins: np.ndarray) -> bytes:
  """The positions as stored: each chunk's size (the first: where it begins), 8 bytes little-endian, deflated.
  Sizes repeat (one per document length), so this is 1-2 bytes a record."""
  return zlib.compress(np.diff(begins, prepend=0).astype('<u8').tobytes(), 9)


def write(shard_path: str, records: int) -> dict:
  """Builds and writes the index beside the shard; returns its manifest entry (file, bytes, sha256)."""
  raw = encode(build(shard_path, records))
  path = name_of(shard_path)
  with open(path, 'wb') as f:
    f.write(raw)
  return {'file': os.path.basename(path), 'bytes': len(raw), 'sha256': hashlib.sha256(raw).hexdigest()}


def parse(raw: bytes, where: str, records: int) -> np.ndarray:
  """An index's bytes (written by `write`) as records + 1 positions; DataError if they do not fit the shard."""
  try:
    sizes = np.frombuffer(zlib.decompress(raw), '<u8')
  except (zlib.error, ValueError) as e:
    raise errors.DataError(f'{where}: unreadable index ({e})') from None
  if sizes.size != records + 1 or np.any(sizes[1:] == 0):
    raise errors.DataError(f'{where}: {sizes.size} positions for {records} records; the index is damaged')
  return np.cumsum(sizes.astype(np.int64))
