"""Where a host reads prepared shards: in place (a local directory), or from a bucket through a bounded cache
(docs/pods.md, "The bounded cache"). Whole files, because random record reads over HTTP run ~50x slower than from
disk; a file takes its name only once whole and checked, so a kill leaves a `.part` the next start discards.
"""

import collections
import concurrent.futures
import dataclasses
import errno
import hashlib
import logging
import os
import shutil
import threading
from typing import Iterable

from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax import bucket, errors, paths
from neobert_jax.data import shards

log = logging.getLogger('neobert_jax.data')


@dataclasses.dataclass
class Stats:
  """A store's counters, for the tests and the benchmarks."""

  bytes_downloaded: int = 0
  bytes_read: int = 0  # record bytes the reader took (a source's consumption, whatever the files fetched)
  disk_bytes: int = 0
  peak_disk_bytes: int = 0


class _Readers:
  """One open ArrayRecord reader per local file, closed when the file is dropped."""

  def __init__(self):
    self._open: dict[str, object] = {}
    self._lock = threading.Lock()

  def __getstate__(self):  # mp_prefetch workers get their own readers (and lock)
    return {}

  def __setstate__(self, state):
    self.__init__()

  def read(self, path: str, records: list[int]) -> list[bytes]:
    # ArrayRecord's own reader: Grain's data source over it starts a thread per call, about 1 ms a block.
    with self._lock:
      opened = self._open.get(path)
      if opened is None:
        opened = self._open[path] = (ArrayRecordReader(path, 'readahead_buffer_size:0'), threading.Lock())
    src, lock = opened
    with lock:  # one read at a time per file: the reader is not documented as thread-safe
      return src.read(records)

  def drop(self, path: str) -> None:
    with self._lock:
      src = self._open.pop(path, None)
    if src is not None:
      with src[1]:
        src[0].close()


class Store:
  """The shard files of the local folder `dir`, read in place (LocalStore) or fetched there (BucketStore): a reader
  pins its block's files (acquire, matched by one release), asks for the next window (prefetch), reads records."""

  caches: bool = False  # keeps files within a budget (factories.cache_need sizes it)
  stats: Stats

  def __init__(self, directory: str):
    self.dir = directory  # a file's local path is os.path.join(store.dir, name)
    self.stats = Stats()
    self._readers = _Readers()

  def acquire(self, names: Iterable[str]) -> None:  # in place, nothing to pin, release or fetch
    pass

  release = prefetch = acquire

  def read(self, name: str, records: list[int]) -> list[bytes]:
    out = self._readers.read(os.path.join(self.dir, name), records)
    self.stats.bytes_read += sum(map(len, out))
    return out

  def close(self) -> None:
    pass


class LocalStore(Store):
  """Shards read where they are. Each file this host uses is checked (size, records) when the store opens."""

  def __init__(self, directory: str, listed: list[dict]):
    super().__init__(directory)
    for shard in listed:
      path = os.path.join(directory, shard['file'])
      if not os.path.isfile(path):
        raise _missing(path, directory)
      _check_size(path, os.path.getsize(path), shard, directory, 'on disk')
      _check_records(path, path, shard, directory)


class BucketStore(Store):
  """Shards of a bucket, fetched into a bounded local cache ahead of the reader (see the module docstring)."""

  caches = True

  def __init__(
    self, url: paths.Path, listed: list[dict], budget_bytes: int, process_index: int, version: str, split: str
  ):
    # Keyed by the manifest too: data prepared again under the same URL never reuses the old files. One folder per
    # split: a store adopts or removes every file in its folder, so the held-out reader must not share the train's.
    super().__init__(str(paths.cache_dir('stream', paths.url_key(url), version, f'process-{process_index}', split)))
    self.url, self.budget = url, budget_bytes
    self.by_name = {s['file']: s for s in listed}
    self._lock = threading.Condition()
    self._pins: collections.Counter = collections.Counter()
    self._lru: collections.OrderedDict[str, int] = collections.OrderedDict()  # local files -> bytes
    self._pending: dict[str, concurrent.futures.Future] = {}
    self._pool = concurrent.futures.ThreadPoolExecutor(bucket.PARALLEL, thread_name_prefix='neobert-fetch')
    for shard in listed:  # each on the bucket at its manifest size: damage is one line before a byte moves
      src = url / shard['file']
      try:
        size = src.stat().length
      except FileNotFoundError:
        raise _missing(src, url) from None
      _check_size(str(src), size, shard, str(url), 'on the bucket')
    # Whole files of this share from an earlier start are kept (they were checked before taking their name).
    for name in sorted(os.listdir(self.dir)):
      path = os.path.join(self.dir, name)
      shard = self.by_name.get(name)
      if os.path.isdir(path):
        shutil.rmtree(path)  # another layout's folder: this store owns its folder
      elif shard is None or os.path.getsize(path) != shard['bytes']:
        os.remove(path)  # a .part of a killed download, or a file of other data
      else:
        self._lru[name] = shard['bytes']
    self.stats.disk_bytes = self.stats.peak_disk_bytes = sum(self._lru.values())

  def acquire(self, names) -> None:
    """Pins `names` and returns once all are local (downloading those that are not)."""
    with self._lock:
      self._pins.update(names)
      futures = [self._start(n, required=True) for n in names]
    for f in futures:
      if f is not None:
        f.result()  # a failed download raises its DataError / StorageError here, in the reader
    with self._lock:
      for n in names:
        if n in self._lru:
          self._lru.move_to_end(n)

  def release(self, names) -> None:
    with self._lock:
      self._pins -= collections.Counter(names)  # keeps positive counts only: an unpinned name never goes below 0
      self._lock.notify_all()

  def prefetch(self, names) -> None:
    """Starts downloading `names` in the background if the budget has room for them now."""
    with self._lock:
      for n in names:
        self._start(n, required=False)

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)

  # -- under self._lock --
  def _start(self, name: str, required: bool):
    if name in self._lru:
      return None
    if name in self._pending:
      return self._pending[name]
    size = self.by_name[name]['bytes']
    if not self._make_room(size) and not required:
      return None
    self.stats.disk_bytes += size  # reserved now, so concurrent starts cannot overshoot the budget
    self.stats.peak_disk_bytes = max(self.stats.peak_disk_bytes, self.stats.disk_bytes)
    fut = self._pending[name] = self._pool.submit(self._download, name)
    return fut

  def _make_room(self, size: int) -> bool:
    """Evicts unpinned files, oldest use first, until `size` more bytes fit the budget; False if they cannot."""
    for name in list(self._lru):
      if self.stats.disk_bytes + size <= self.budget:
        break
      if self._pins[name] == 0:
        self._readers.drop(os.path.join(self.dir, name))
        os.remove(os.path.join(self.dir, name))
        self.stats.disk_bytes -= self._lru.pop(name)
    return self.stats.disk_bytes + size <= self.budget

  # -- download threads --
  def _download(self, name: str) -> None:
    shard = self.by_name[name]
    try:
      fetch_shard(self.url, self.dir, shard)
    except BaseException:
      with self._lock:
        self.stats.disk_bytes -= shard['bytes']
        self._pending.pop(name, None)
      raise
    with self._lock:
      self._pending.pop(name, None)
      self._lru[name] = shard['bytes']
      self.stats.bytes_downloaded += shard['bytes']


def fetch_shard(url: paths.Path, local: str, shard: dict) -> None:
  """One shard, streamed through a .part file and hashed on the way; checked before it takes its name."""
  src, dst = url / shard['file'], os.path.join(local, shard['file'])
  part = os.path.join(local, f'.{shard["file"]}.part')
  h, size = hashlib.sha256(), 0
  try:
    # Said when it took retries or longer than "slow" (bucket.py).
    with bucket.Timer(f'fetching data shard {src}'), src.open('rb') as fin, open(part, 'wb') as fout:
      while block := fin.read(1 << 22):
        h.update(block)
        fout.write(block)
        size += len(block)
  except FileNotFoundError:
    raise _missing(src, url) from None
  except Exception as e:  # noqa: BLE001 - a network or permission failure mid-copy (gcsfs raises its own types)
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      raise errors.StorageError(
        f'{local}: no space left while fetching {src}; free space there, lower data.cache_gb, or set '
        'NEOBERT_JAX_CACHE to a larger disk'
      ) from None
    raise errors.StorageError(
      f'{src}: download failed ({errors.one_line(e)}); nothing was lost, run again to resume from the last checkpoint'
    ) from None
  _check_size(str(src), size, shard, str(url), 'on the bucket')
  if 'sha256' in shard and h.hexdigest() != shard['sha256']:
    raise errors.DataError(
      f'{src}: content differs from the manifest (sha256 {h.hexdigest()[:16]}..., manifest '
      f'says {shard["sha256"][:16]}...); {shards.remedy(str(url))}'
    )
  _check_records(part, str(src), shard, str(url))
  os.replace(part, dst)


def _missing(path, directory) -> errors.DataError:
  return errors.DataError(f'{path}: shard listed in the manifest is missing; {shards.remedy(str(directory))}')


def _check_size(shown: str, size: int, shard: dict, directory: str, where: str) -> None:
  if size != shard['bytes']:
    raise errors.DataError(
      f'{shown}: {size} bytes {where}, manifest says {shard["bytes"]} '
      f'(truncated or replaced shard); {shards.remedy(directory)}'
    )


def _check_records(path: str, shown: str, shard: dict, directory: str) -> None:
  """The shard at local `path` opens and holds the manifest's record count; errors name `shown`."""
  try:
    reader = ArrayRecordReader(path)
    n = reader.num_records()
    reader.close()
  except Exception as e:  # the C++ reader raises RuntimeError/ValueError variants
    raise errors.DataError(f'{shown}: corrupt shard ({e}); {shards.remedy(directory)}') from e
  if n != shard['records']:
    raise errors.DataError(f'{shown}: {n} records, manifest says {shard["records"]}; {shards.remedy(directory)}')
