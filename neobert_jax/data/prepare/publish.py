"""`prepare --output gs://...`: the finished shards go up to the bucket, the manifest last.

ArrayRecordWriter (array_record 0.8.6) cannot write gs:// ("open() failed: No such file or directory"), so
`prepare` writes its shards to local scratch exactly as it does for a local output, and this module uploads
them: the bytes on the bucket are those a local prepare writes. The manifest is the commit marker here too:
  * without --overwrite, an output that already holds a manifest is refused before any work, untouched;
  * with it, the old manifest is removed before the first shard goes up (so nothing reads a half-replaced
    output as prepared data, as locally), the new one is uploaded after the last shard, and only then are the
    shards it does not list removed.
An upload cut short leaves no manifest: readers refuse the output as unfinished, and running prepare again
(--overwrite) replaces it.

The Ray engine (ray_engine.py) writes each shard on the node that assembles it and puts it in place with
`put_file` (local: a shared directory, renamed in whole; bucket: uploaded and its size checked), then `commit`s:
the manifest last, then the removal of shards it does not list. `open_output` is both engines' check before work.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil

from neobert_jax import bucket, errors, paths
from neobert_jax.data import shards

# Uploads in flight: one GCS stream is limited well below a VM's network, so a few at once.
PARALLEL = 4


def open_output(output_dir: str, overwrite: bool) -> paths.Path:
  """Before tokenizing, for both engines: an output that holds prepared data is refused without --overwrite
  (FileExistsError, untouched); a bucket must take writes; a local directory is created."""
  out = paths.resolve(output_dir, '--output')
  if not paths.local(out):
    check_output(out, overwrite)
    return out
  if (out / shards.MANIFEST).exists() and not overwrite:
    raise FileExistsError(f'{output_dir} already holds prepared data (pass --overwrite)')
  out.mkdir(parents=True, exist_ok=True)
  return out


def check_output(out: paths.Path, overwrite: bool) -> None:
  """Before tokenizing: an existing output without --overwrite is refused, and the bucket must take writes."""
  if not overwrite and (out / shards.MANIFEST).exists():
    raise FileExistsError(f'{out} already holds prepared data (pass --overwrite)')
  paths.check_writable(out, '--output')


def scratch_root() -> str:
  """Where shards bound for a bucket are written first (as large as the prepared data)."""
  return str(paths.cache_dir('prepare-scratch'))


def upload(local: str, out: paths.Path, manifest: shards.Manifest) -> None:
  """Puts the shards `manifest` lists from the local directory `local` at `out`, then the manifest."""
  names = manifest.files()
  try:
    with bucket.Timer(f'upload of {len(names)} shards to {out}'):
      (out / shards.MANIFEST).unlink(missing_ok=True)  # from here on the output reads as unfinished
      with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(lambda name: _put(os.path.join(local, name), out / name), names))
      manifest.write(out)  # the commit marker, last
  except errors.NeobertError:
    raise
  except Exception as e:  # noqa: BLE001 - gcsfs raises its own types for HTTP 403 / 5xx
    raise errors.StorageError(
      f'--output={out}: upload failed ({errors.one_line(e)}); it holds no complete '
      'prepared data now: run prepare again with --overwrite'
    ) from None
  remove_unlisted(out, names)


def remove_unlisted(out: paths.Path, names: list[str]) -> None:
  """Removes the shards at `out` that the (new, committed) manifest does not list: an old output's, or those of a
  build cut short."""
  try:
    for obj in out.iterdir():
      if shards.is_shard_file(obj.name) and obj.name not in names:
        obj.unlink()
  except Exception as e:  # noqa: BLE001 - the new data is complete; only leftovers remain
    raise errors.StorageError(
      f'--output={out}: the prepared data is complete, but shards it does not list could '
      f'not be removed ({errors.one_line(e)}); delete them by hand'
    ) from None


def commit(out: paths.Path, manifest: shards.Manifest) -> None:
  """The shards `manifest` lists are in place at `out`: the manifest goes up last, then unlisted shards go."""
  manifest.write(os.fspath(out))
  remove_unlisted(out, manifest.files())


def put_file(src: str, dst: paths.Path) -> None:
  """Moves the local file `src` to `dst` whole: a reader sees the old file or the new one, never part of it."""
  if not paths.local(dst):
    _put(src, dst)
    os.remove(src)
    return
  tmp = f'{os.fspath(dst)}.tmp-{os.getpid()}'
  try:
    os.replace(src, tmp)  # same filesystem: a rename
  except OSError:
    shutil.copyfile(src, tmp)  # the scratch and the shared output are on different filesystems
    os.remove(src)
  os.replace(tmp, dst)


def _put(src: str, dst: paths.Path) -> None:
  paths.copy(paths.Path(src), dst)
  size = dst.stat().length
  if size != os.path.getsize(src):
    raise errors.StorageError(
      f'{dst}: {size} bytes on the bucket after upload, {os.path.getsize(src)} written '
      'locally; run prepare again with --overwrite'
    )
