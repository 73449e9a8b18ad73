"""Putting prepared data in place, for both engines: the old manifest goes before the first shard, the new one (the
commit marker) after the last, then the shards it does not list. ArrayRecordWriter (array_record 0.8.6) cannot
write gs://, so shards bound for a bucket are written to local scratch as for a local output, then uploaded."""

import concurrent.futures
import os
import shutil

from neobert_jax import bucket, errors, paths
from neobert_jax.data import shards


def open_output(output_dir: str, overwrite: bool) -> paths.Path:
  """Before tokenizing: an output that holds prepared data is refused without --overwrite (FileExistsError,
  untouched); a bucket must take writes; a local directory is created."""
  out = paths.resolve(output_dir, '--output')
  if (out / shards.MANIFEST).exists() and not overwrite:
    raise FileExistsError(f'{output_dir if paths.local(out) else out} already holds prepared data (pass --overwrite)')
  if paths.local(out):
    out.mkdir(parents=True, exist_ok=True)
  else:
    paths.check_writable(out, '--output')
  return out


def scratch_root() -> str:
  """Where shards bound for a bucket are written first (as large as the prepared data)."""
  return str(paths.cache_dir('prepare-scratch'))


def upload(local: str, out: paths.Path, manifest: shards.Manifest) -> None:
  """Puts the shards `manifest` lists from the local directory `local` at `out`, then the manifest."""
  names = manifest.files()
  try:
    with bucket.Timer(f'upload of {len(names)} shards to {out}'):
      (out / shards.MANIFEST).unlink(missing_ok=True)  # from here on the output reads as unfinished
      with concurrent.futures.ThreadPoolExecutor(bucket.PARALLEL) as pool:
        list(pool.map(lambda name: _put(os.path.join(local, name), out / name), names))
      manifest.write(out)  # the commit marker, last
  except errors.NeobertError:
    raise
  except Exception as e:  # noqa: BLE001 - gcsfs raises its own types for HTTP 403 / 5xx
    raise errors.StorageError(
      f'--output={out}: upload failed ({errors.one_line(e)}); it holds no complete '
      'prepared data now: run prepare again with --overwrite'
    ) from None
  _remove_unlisted(out, names)


def commit(out: paths.Path, manifest: shards.Manifest) -> None:
  """With the listed shards in place (put_file): the manifest, then the removal of unlisted (older) shards."""
  manifest.write(os.fspath(out))
  _remove_unlisted(out, manifest.files())


def _remove_unlisted(out: paths.Path, names: list[str]) -> None:
  try:
    for obj in out.iterdir():
      if obj.name.endswith(('.arrayrecord', '.arrayrecord.index')) and obj.name not in names:  # a shard or its index
        obj.unlink()
  except Exception as e:  # noqa: BLE001 - the new data is complete; only leftovers remain
    raise errors.StorageError(
      f'--output={out}: the prepared data is complete, but shards it does not list could '
      f'not be removed ({errors.one_line(e)}); delete them by hand'
    ) from None


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
