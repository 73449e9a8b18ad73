"""Where runs and data live: a local path or an object-store URL, through one layer (etils.epath).

Every path a user gives (workdir, prepared data, init sources, exports, inputs) goes through `resolve`: a local path
becomes an absolute epath.Path; `gs://bucket/...` stays a URL whose reads and writes go to the bucket (epath ->
gcsfs, Orbax -> tensorstore, both with the platform's default credentials). What object stores lack is made up
for here, once:
  * no atomic rename: `write_text` writes a local file through a temporary name and `replace`, and an object in
    one upload (a GCS object appears whole or not at all); multi-file outputs are committed by a marker written
    last (the prepared data's manifest.json, the export's config.json), so a reader never sees half of one;
  * no append: `append_line` rewrites the (small) object; streams that grow all run long (metrics.jsonl,
    TensorBoard events) are written to a local mirror and uploaded by `Mirror.sync`;
  * a missing bucket or a refused write should be one line before any heavy work: `check_writable`.
`s3://` is refused with one line before any work: Orbax 0.12.8's OCDBT layer cannot checkpoint there (it
normalises only gs:// URLs, "Checkpoint path should be absolute"), and a run whose checkpoints cannot go where its
workdir is would be a trap. Mount the bucket (mountpoint-s3, s3fs-fuse) and pass the local mount point instead.

Imports only errors and bucket (the retry budget, installed when a gs:// path is first resolved) from the package:
every layer above may use it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path as LocalPath
from typing import Union

from etils import epath

from neobert_jax import bucket, errors

Path = epath.Path
PathLike = Union[str, os.PathLike]
URL_SCHEMES = ('gs://',)
_REFUSED = {
  's3://': (
    's3:// is not supported: runs and their data go where their checkpoints can, and Orbax 0.12.8 '
    'writes checkpoints only to gs:// (its OCDBT layer refuses s3://); mount the bucket '
    '(mountpoint-s3 or s3fs-fuse) and pass the mount point, or use gs://'
  )
}

# gcsfs logs a warning on every bucket access without a metadata server ("could not determine bucket type"):
# noise on every machine that authenticates by other means, and in the tests' emulator.
logging.getLogger('gcsfs').setLevel(logging.ERROR)


def is_url(path: PathLike) -> bool:
  return '://' in os.fspath(path)


def resolve(path: PathLike, what: str = 'path') -> epath.Path:
  """A user's path or URL as an epath.Path: local paths absolute (~ expanded), gs:// URLs as given.

  Any other scheme is a ConfigError naming `what` (e.g. '--workdir') and the fix, raised before anything is done;
  so a URL never becomes a local folder named 's3:'.
  """
  text = os.fspath(path)
  if not text:
    raise errors.ConfigError(f'{what} is empty')
  if is_url(text):
    for scheme, why in _REFUSED.items():
      if text.startswith(scheme):
        raise errors.ConfigError(f'{what}={text}: {why}')
    if not text.startswith(URL_SCHEMES):
      raise errors.ConfigError(f'{what}={text}: unsupported URL scheme; use a local path or gs://bucket/...')
    bucket.install()  # the one retry budget, before anything reaches the bucket through gcsfs
    return epath.Path(text.rstrip('/'))
  return epath.Path(LocalPath(text).expanduser().resolve())


def resolved(path: PathLike, what: str = 'path') -> epath.Path:
  """`path` as resolve gives it; an epath.Path is taken as already resolved (a job resolves its workdir once and
  hands the result down)."""
  return path if isinstance(path, epath.Path) else resolve(path, what)


def local(path: epath.Path) -> bool:
  return not is_url(path)


def write_bytes(path: epath.Path, data: bytes) -> None:
  """All or nothing: a reader sees the old content or the new, never part (see the module docstring). Every file a
  job writes whole (a report, a plot, an embedding array) goes through here, never through a library's own open():
  matplotlib or numpy would take a gs:// URL for a local file name."""
  if local(path):
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
    tmp.write_bytes(data)
    os.replace(tmp, path)
  else:
    path.write_bytes(data)


def write_text(path: epath.Path, text: str) -> None:
  """write_bytes of the text, UTF-8."""
  write_bytes(path, text.encode('utf-8'))


def append_line(path: epath.Path, line: str) -> None:
  """Appends one line (for small logs such as config_history.jsonl; objects cannot be appended to)."""
  if local(path):
    with open(path, 'a', encoding='utf-8') as f:
      f.write(line.rstrip('\n') + '\n')
  else:
    old = path.read_text() if path.exists() else ''
    path.write_text(old + line.rstrip('\n') + '\n')


def check_writable(directory: epath.Path, what: str) -> None:
  """Creates `directory` if needed and writes and removes a probe object in it; StorageError (one line naming the
  URL and the fix) when the bucket does not exist or refuses writes. Nothing already there is touched."""
  created = local(directory) and not directory.exists()
  probe = directory / f'.write-probe-{os.getpid()}'
  try:
    directory.mkdir(parents=True, exist_ok=True)
    probe.write_text('')
    probe.unlink()
    if created:  # a refusal further on must not leave an empty directory behind
      directory.rmdir()
  except Exception as e:  # noqa: BLE001 - OSError locally; gcsfs raises its own types for HTTP 403 / 404
    reason = getattr(e, 'strerror', None) or errors.one_line(e)
    fix = (
      'check that the bucket exists and that these credentials may write to it (gcloud auth '
      'application-default login, or the VM / pod service account)'
      if not local(directory)
      else 'make it writable or pass another path'
    )
    raise errors.StorageError(
      f'{what}={directory} cannot be written ({reason}); {fix}. Nothing there was changed.'
    ) from None


def cache_dir(*parts: str) -> LocalPath:
  """This machine's cache ($NEOBERT_JAX_CACHE, else ~/.cache/neobert_jax), or a folder in it; created."""
  root = os.environ.get('NEOBERT_JAX_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'neobert_jax')
  d = LocalPath(root, *parts)
  d.mkdir(parents=True, exist_ok=True)
  return d


def url_key(url: epath.Path | str) -> str:
  """A short, stable folder name for a URL's local copy."""
  return hashlib.sha256(os.fspath(url).encode()).hexdigest()[:16]


def sha256(path: epath.Path, chunk: int = 1 << 22) -> str:
  h = hashlib.sha256()
  with path.open('rb') as f:
    while block := f.read(chunk):
      h.update(block)
  return h.hexdigest()


def read_ranges(path: epath.Path, spans: list[tuple[int, int]]) -> list[bytes]:
  """The bytes [start, end) of each span of one file: from a bucket, one ranged GET per span, all in flight at once
  (gcsfs's cat_ranges), so only those bytes leave the bucket."""
  if local(path):
    with open(path, 'rb') as f:
      return [_read_at(f, a, b) for a, b in spans]
  import fsspec  # pylint: disable=g-import-not-at-top

  fs = fsspec.filesystem('gs', finalize_on_close=True)  # the instance epath's gs:// paths use
  name = os.fspath(path)
  return fs.cat_ranges([name] * len(spans), [a for a, _ in spans], [b for _, b in spans], on_error='raise')


def _read_at(f, start: int, end: int) -> bytes:
  f.seek(start)
  return f.read(end - start)


def copy(src: epath.Path, dst: epath.Path) -> None:
  """One file, any direction (local <-> bucket), in chunks."""
  with src.open('rb') as fin, dst.open('wb') as fout:
    shutil.copyfileobj(fin, fout, 1 << 22)


def publish_dir(local_dir: PathLike, remote: epath.Path, marker: str) -> None:
  """Uploads the files of `local_dir` to the bucket directory `remote`, `marker` last, so a reader that waits for
  the marker never takes a half-uploaded directory for a finished one. An earlier directory there loses its marker
  first and, once the new one is complete, the files the new one does not have."""
  local_dir = LocalPath(local_dir)
  files = sorted(p.relative_to(local_dir).as_posix() for p in local_dir.rglob('*') if p.is_file())
  if marker not in files:
    raise ValueError(f'{local_dir} has no {marker} to commit it with')
  old = set(_files(remote))
  if marker in old:
    (remote / marker).unlink()
  for rel in [f for f in files if f != marker] + [marker]:
    (remote / rel).parent.mkdir(parents=True, exist_ok=True)
    copy(epath.Path(local_dir / rel), remote / rel)
  for rel in sorted(old - set(files)):
    (remote / rel).unlink()


def _files(root: epath.Path) -> list[str]:
  """Relative paths of the files under `root` (empty when it does not exist)."""
  if not root.exists():
    return []
  out = []
  for child in root.iterdir():  # epath refuses '**' globs on buckets: walk level by level
    if child.is_dir():
      out += [f'{child.name}/{rel}' for rel in _files(child)]
    else:
      out.append(child.name)
  return sorted(out)


def local_copy(source: PathLike, marker: str | None = None) -> LocalPath:
  """A local path for `source`: itself when local, else a copy of the bucket file or directory in this machine's
  cache (downloaded again each call: sources are small, such as a Hugging Face directory or a CSV file; prepared
  data has its own staging with checksums). With `marker`, a directory without that file is refused: it is not
  (yet) complete."""
  src = resolve(source)
  if local(src):
    return LocalPath(os.fspath(src))
  dst = cache_dir('downloads', url_key(src)) / src.name
  shutil.rmtree(dst, ignore_errors=True)
  if not src.is_dir():
    if not src.exists():
      raise FileNotFoundError(f'{src}: no such object')
    dst.parent.mkdir(parents=True, exist_ok=True)
    copy(src, epath.Path(dst))
    return dst
  names = _files(src)
  if marker is not None and marker not in names:
    raise FileNotFoundError(f'{src} has no {marker}: not a complete directory (an upload still running, or failed)')
  for rel in names:
    (dst / rel).parent.mkdir(parents=True, exist_ok=True)
    copy(src / rel, epath.Path(dst / rel))
  return dst


class Mirror:
  """A local directory standing in for `remote` (a run's append-only streams: metrics.jsonl, TensorBoard).

  For a local `remote` it is `remote` itself and `sync` does nothing. For a bucket, the files are written under
  `cache` and `sync` uploads the ones that changed since the last sync; `pull` first downloads what the bucket
  already holds (a resumed run appends to its own history).
  """

  def __init__(self, remote: epath.Path, cache: PathLike):
    self.remote = remote
    self.path = LocalPath(os.fspath(remote)) if local(remote) else LocalPath(cache)
    self._sent: dict[str, tuple[int, int]] = {}

  def pull(self, names: tuple[str, ...]) -> None:
    """Starts the mirror afresh (a copy left by an earlier run of the same URL is removed) from the remote's
    `names`."""
    if local(self.remote):
      return
    shutil.rmtree(self.path, ignore_errors=True)
    self.path.mkdir(parents=True, exist_ok=True)
    for name in names:
      src = self.remote / name
      if src.exists() and not src.is_dir():
        copy(src, epath.Path(self.path / name))

  def sync(self) -> None:
    if local(self.remote):
      return
    for f in sorted(self.path.rglob('*')):
      if not f.is_file():
        continue
      rel = f.relative_to(self.path).as_posix()
      stat = f.stat()
      if self._sent.get(rel) == (stat.st_size, stat.st_mtime_ns):
        continue
      dst = self.remote / rel
      dst.parent.mkdir(parents=True, exist_ok=True)
      copy(epath.Path(f), dst)
      self._sent[rel] = (stat.st_size, stat.st_mtime_ns)
