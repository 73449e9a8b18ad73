"""Shards of a bucket read record by record: each record a reader takes is one ranged read, nothing else of the file.

This is how a mixture's sources read from a bucket (data.bucket_reads='auto'). The bytes each source sends then
follow the rows it gives, so they follow the weights whatever the sources' sizes. The file store (store.py) fetches
whole files a window ahead: the better choice for one large source, since large sequential reads are the fastest.
Here a small source would be one file, fetched whole at its first row.

Where a record lies comes from the shard's index (data/record_index.py, written by prepare). The store keeps the
indexes of the files its readers hold, fetched whole and checked against the manifest's sha256. A block's records
of one file are fetched together: all the ranges in flight at once, neighbouring records merged into one range. A
range is a record's whole chunk (its ~45 bytes of framing with it), whose layout is checked (record_index.record_of).
Nothing is written to disk: a restart only reads the indexes again.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import threading
import time

import numpy as np

from neobert_jax import bucket, errors, paths
from neobert_jax.data import record_index, shards
from neobert_jax.data.pipeline import store as store_lib

KEEP_INDEXES = 64  # indexes of released files kept for reuse (8 bytes a record in memory)


def indexed(listed: list[dict]) -> bool:
  """Whether every listed shard has a record index (prepared data written before indexes has none)."""
  return all('index' in s for s in listed)


class RecordStore:
  """A store.Store over a bucket's shards that fetches only the records its readers take."""

  caches = False  # keeps no files: nothing to size (cache.check_cache)

  def __init__(self, url: paths.Path, listed: list[dict]):
    self.url = url
    self.by_name = {s['file']: s for s in listed}
    self.stats = store_lib.Stats()
    self._lock = threading.Lock()
    self._pins: collections.Counter = collections.Counter()
    self._index: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
    self._loading: dict[str, concurrent.futures.Future] = {}
    self._pool = concurrent.futures.ThreadPoolExecutor(store_lib.PARALLEL, thread_name_prefix='neobert-index')
    store_lib.check_bucket_sizes(url, listed)
    store_lib.check_bucket_sizes(url, [s['index'] for s in listed])

  def acquire(self, names) -> None:
    with self._lock:
      for n in names:
        self._pins[n] += 1
    for n in names:
      self._load(n)

  def release(self, names) -> None:
    with self._lock:
      for n in names:
        if self._pins[n] > 0:
          self._pins[n] -= 1
      unpinned = [n for n in self._index if self._pins[n] == 0]
      for n in unpinned[: max(0, len(unpinned) - KEEP_INDEXES)]:
        del self._index[n]

  def prefetch(self, names) -> None:
    """Fetches the indexes of `names` in the background; their records are read when a reader asks for them."""
    for n in names:
      with self._lock:
        if n in self._index or n in self._loading:
          continue
        self._loading[n] = self._pool.submit(self._fetch_index, n)

  def read(self, name: str, records: list[int]) -> list[bytes]:
    begins = self._load(name)
    # A block longer than an epoch of its share names a record more than once: each is fetched once.
    unique, where = np.unique(np.asarray(records, np.int64), return_inverse=True)
    starts, ends = begins[unique], begins[unique + 1]
    # Ranges in file order (np.unique sorts), neighbouring chunks merged into one: [start, end, first, last + 1).
    spans: list[list[int]] = []
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
      if spans and a == spans[-1][1]:
        spans[-1][1], spans[-1][3] = b, i + 1
      else:
        spans.append([a, b, i, i + 1])
    src = self.url / name
    got: list[bytes] = []
    for (start, _, first, last), blob in zip(spans, self._fetch_ranges(src, [(a, b) for a, b, _, _ in spans])):
      for a, b in zip(starts[first:last].tolist(), ends[first:last].tolist()):
        got.append(record_index.record_of(blob[a - start : b - start], a, b, str(src)))
    out = [got[i] for i in where.tolist()]
    with self._lock:
      self.stats.bytes_downloaded += sum(b - a for a, b, _, _ in spans)
      self.stats.bytes_read += sum(map(len, out))
      self.stats.requests += len(spans)
    return out

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)

  def _fetch_ranges(self, src: paths.Path, spans: list[tuple[int, int]]) -> list[bytes]:
    if not spans:
      return []
    with bucket.Timer(f'reading {len(spans)} records of {src}'):
      return self._get(src, 'shard', lambda: paths.read_ranges(src, spans))

  def _get(self, src: paths.Path, what: str, read):
    """read() of the bucket object `src` (a `what`); a missing object or a failed read as one line naming it."""
    try:
      return read()
    except FileNotFoundError:
      raise errors.DataError(
        f'{src}: {what} listed in the manifest is missing; {shards.remedy(str(self.url))}'
      ) from None
    except Exception as e:  # noqa: BLE001 - gcsfs raises its own types once the retry window is spent
      raise store_lib.download_failed(src, e) from None

  def _load(self, name: str) -> np.ndarray:
    with self._lock:
      if name in self._index:
        self._index.move_to_end(name)
        return self._index[name]
      pending = self._loading.get(name)
    return pending.result() if pending is not None else self._fetch_index(name)

  def _fetch_index(self, name: str) -> np.ndarray:
    shard = self.by_name[name]
    meta = shard['index']
    src = self.url / meta['file']
    raw = self._get(src, 'index', src.read_bytes)
    if hashlib.sha256(raw).hexdigest() != meta['sha256']:
      raise errors.DataError(f'{src}: content differs from the manifest (sha256); {shards.remedy(str(self.url))}')
    index = record_index.parse(raw, str(src), shard['records'])
    with self._lock:
      self._loading.pop(name, None)
      self._index[name] = index
      self.stats.bytes_downloaded += len(raw)
      self.stats.files_downloaded += 1
      if self.stats.first_file_seconds is None:
        self.stats.first_file_seconds = time.perf_counter() - self.stats.opened
    return index
