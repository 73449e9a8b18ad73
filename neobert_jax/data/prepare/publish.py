"""Putting prepared shards in place, the manifest last (it is the commit marker).

ArrayRecordWriter cannot write gs://, so shards for a bucket are written to local scratch and uploaded: the same
bytes as a local prepare's. An old manifest is removed before the first shard and unlisted shards after the new one.
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
  """Before tokenizing: refuses prepared data without --overwrite, checks a bucket takes writes, makes a directory."""
  out = paths.resolve(output_dir, '--output')
  if not paths.local(out):
    check_output(out, overwrite)
    return out
  if (out / shards.MANIFEST).exists() and not overwrite:
    raise FileExistsError(f'{output_dir} already holds prepared data (pass --overwrite)')
  out.mkdir(parents=True, exist_ok=True)
  return out


def check_output(out: paths.Path, overwrite: bool) -> None:
  if not overwrite and (out / shards.MANIFEST).exists():
    raise FileExistsError(f'{out} already holds prepared data (pass --overwrite)')
  paths.check_writable(out, '--output')


def scratch_root() -> str:
  return str(paths.cache_dir('prepare-scratch'))


def upload(local: str, out: paths.Path, manifest: dict) -> None:
  """Puts the shards `manifest` lists from the local directory `local` at `out`, then the manifest."""
  names = shards.listed_files(manifest)
  try:
    with bucket.Timer(f'upload of {len(names)} shards to {out}'):
      (out / shards.MANIFEST).unlink(missing_ok=True)  # from here on the output reads as unfinished
      with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(lambda name: _put(os.path.join(local, name), out / name), names))
      paths.write_text(out / shards.MANIFEST, shards.manifest_text(manifest))  # the commit marker, last
  except errors.NeobertError:
    raise
  except Exception as e:  # noqa: BLE001 - gcsfs raises its own types for HTTP 403 / 5xx
    raise errors.StorageError(
      f'--output={out}: upload failed ({errors.one_line(e)}); it holds no complete '
      'prepared data now: run prepare again with --overwrite'
    ) from None
  remove_unlisted(out, names)


def remove_unlisted(out: paths.Path, names: list[str]) -> None:
  """Removes the shards at `out` that the committed manifest does not list."""
  try:
    for obj in out.iterdir():
      if shards.is_shard_file(obj.name) and obj.name not in names:
        obj.unlink()
  except Exception as e:  # noqa: BLE001 - the new data is complete; only leftovers remain
    raise errors.StorageError(
      f'--output={out}: the prepared data is complete, but shards it does not list could '
      f'not be removed ({errors.one_line(e)}); delete them by hand'
    ) from None


def commit(out: paths.Path, manifest: dict) -> None:
  if paths.local(out):
    shards.write_manifest(os.fspath(out), manifest)
  else:
    paths.write_text(out / shards.MANIFEST, shards.manifest_text(manifest))
  remove_unlisted(out, shards.listed_files(manifest))


def put_file(src: str, dst: paths.Path) -> None:
  """Moves the local file `src` to `dst` whole: a reader never sees part of it."""
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
