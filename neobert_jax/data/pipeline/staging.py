"""Prepared data on a bucket (data.dir=gs://...), read through a verified local copy: staging.

Training reads shards at random (a shuffled block of documents at a time), record by record. array_record 0.8.6's
C++ reader can open gs:// itself (riegeli's GcsReader, through google-cloud-cpp with its own credentials and its
own endpoint variable, CLOUD_STORAGE_EMULATOR_ENDPOINT), but then every record read is an HTTP range request (on a
loopback emulator ~50x fewer random reads/s than from local disk: benchmarks/data_pipeline.py --emulator) and a
machine with no route to storage.googleapis.com hangs instead of failing. So a bucket's data is copied once per
machine into the cache, cache/staged/<url key>/, and the pipeline reads the local copy:

  * the bucket's manifest is read first and checked as a local one would be; every shard is then checked against
    it: size before any download (a damaged bucket is one line before a byte moves), size and sha256 (when the
    manifest has it; older ones are checked by size and record count) after. Errors name the bucket's URL;
  * the local manifest is written last: it is the staged copy's commit marker, so a copy cut short by a kill has
    none and is staged again (shards already there and matching their sha256 are kept);
  * a copy whose manifest differs from the bucket's (the data was prepared again) is staged again;
  * a file lock per URL: several processes on one machine (one per accelerator) stage it once.
A process that still reads an older copy while another restages it keeps reading its open files (POSIX unlink).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import sys
import time

from neobert_jax import errors, paths
from neobert_jax.data import assets
from neobert_jax.data import shards

# Downloads in flight: one GCS stream is limited well below a VM's network (tens to ~200 MB/s), so a few at once.
PARALLEL = 4


def staged_dir(url: paths.Path) -> str:
  return str(paths.cache_dir('staged', paths.url_key(url)))


def stage(url: paths.Path) -> str:
  """The local directory holding a verified copy of the prepared data at `url` (copied now if needed)."""
  raw = _read_manifest(url)
  manifest = shards.parse_manifest(raw, str(url))
  local = staged_dir(url)
  with assets.locked(f'staged-{paths.url_key(url)}'):
    if not _current(local, raw, manifest):
      _restage(url, local, raw, manifest)
  return local


def _listed(manifest: dict) -> list[dict]:
  return [s for split in shards.SPLITS for s in manifest['splits'].get(split, {'shards': []})['shards']]


def _read_manifest(url: paths.Path) -> bytes:
  try:
    return (url / shards.MANIFEST).read_bytes()
  except FileNotFoundError:
    bucket = paths.Path('/'.join(os.fspath(url).split('/')[:3]))
    if not bucket.exists():
      raise errors.StorageError(f'{url}: bucket {bucket} does not exist, or these credentials cannot see it') from None
    if not url.exists():
      raise errors.DataError(
        f'{url}: prepared-data directory does not exist (nothing under that URL; make it '
        f'with `python -m neobert_jax.data.prepare --output {url}`)'
      ) from None
    raise errors.DataError(
      f'{url}: no {shards.MANIFEST}; the directory is not prepared data, or its prepare run '
      f'did not finish: {shards.remedy(str(url))}'
    ) from None
  except Exception as e:  # noqa: BLE001 - gcsfs raises its own types for HTTP 401 / 403 / 5xx
    raise errors.StorageError(
      f'{url}/{shards.MANIFEST} cannot be read ({errors.one_line(e)}); check that these credentials may read the bucket'
    ) from None


def _current(local: str, raw: bytes, manifest: dict) -> bool:
  """Whether the staged copy is whole and of this manifest (its record counts are checked when it is opened)."""
  try:
    with open(os.path.join(local, shards.MANIFEST), 'rb') as f:
      if f.read() != raw:
        return False
    return all(os.path.getsize(os.path.join(local, s['file'])) == s['bytes'] for s in _listed(manifest))
  except OSError:
    return False


def _restage(url: paths.Path, local: str, raw: bytes, manifest: dict) -> None:
  listed = _listed(manifest)
  for shard in listed:  # sizes first: a damaged bucket costs one listing, not a download
    src = url / shard['file']
    try:
      size = src.stat().length
    except FileNotFoundError:
      raise errors.DataError(f'{src}: shard listed in the manifest is missing; {shards.remedy(str(url))}') from None
    shards.check_size(str(src), size, shard, str(url), 'on the bucket')
  marker = os.path.join(local, shards.MANIFEST)
  if os.path.exists(marker):
    os.remove(marker)  # from here on the copy reads as incomplete
  names = {s['file'] for s in listed}
  for name in os.listdir(local):  # shards of an older copy, and parts of a download that was killed
    if name not in names:
      os.remove(os.path.join(local, name))
  todo = [s for s in listed if not _kept(local, s)]
  need = sum(s['bytes'] for s in todo)
  free = shutil.disk_usage(local).free
  if need > free:
    raise errors.StorageError(
      f'{url}: staging needs {need / 2**30:.1f} GiB in {local} but {free / 2**30:.1f} GiB '
      'are free; free space there or set NEOBERT_JAX_CACHE to a larger disk'
    )
  print(
    f'neobert_jax: staging {url} ({len(todo)} of {len(listed)} shards, {need / 2**20:.1f} MiB) into {local}',
    file=sys.stderr,
    flush=True,
  )
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
    list(pool.map(lambda s: _download(url, local, s), todo))  # the first failure is raised here
  paths.write_text(paths.Path(marker), raw.decode('utf-8'))  # the commit marker, last
  took = time.perf_counter() - start
  print(
    f'neobert_jax: staged {need / 2**20:.1f} MiB in {took:.1f} s ({need / 2**20 / max(took, 1e-9):.0f} MiB/s)',
    file=sys.stderr,
    flush=True,
  )


def _kept(local: str, shard: dict) -> bool:
  """A shard already staged whole (a copy cut short, or a shard the new manifest shares with the old)."""
  path = os.path.join(local, shard['file'])
  return (
    'sha256' in shard
    and os.path.isfile(path)
    and os.path.getsize(path) == shard['bytes']
    and paths.sha256(paths.Path(path)) == shard['sha256']
  )


def _download(url: paths.Path, local: str, shard: dict) -> None:
  """One shard through a .part file, hashed while it streams; checked before it takes its name."""
  src, dst = url / shard['file'], os.path.join(local, shard['file'])
  part = os.path.join(local, f'.{shard["file"]}.part')
  h, size = hashlib.sha256(), 0
  try:
    with src.open('rb') as fin, open(part, 'wb') as fout:
      while block := fin.read(1 << 22):
        h.update(block)
        fout.write(block)
        size += len(block)
  except FileNotFoundError:
    raise errors.DataError(f'{src}: shard listed in the manifest is missing; {shards.remedy(str(url))}') from None
  except Exception as e:  # noqa: BLE001 - a network or permission failure mid-copy
    raise errors.StorageError(
      f'{src}: download failed ({errors.one_line(e)}); nothing was lost, run again to resume staging'
    ) from None
  shards.check_size(str(src), size, shard, str(url), 'on the bucket')
  if 'sha256' in shard and h.hexdigest() != shard['sha256']:
    raise errors.DataError(
      f'{src}: content differs from the manifest (sha256 {h.hexdigest()[:16]}..., manifest '
      f'says {shard["sha256"][:16]}...); {shards.remedy(str(url))}'
    )
  shards.check_records(part, str(src), shard, str(url))
  os.replace(part, dst)
