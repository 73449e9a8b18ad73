"""Where runs and data live: a local path or a gs:// URL through etils.epath, every user path through `resolve`.
Object stores cannot rename or append: whole files go through `write_bytes`, multi-file outputs commit by a marker
written last, growing streams through a local `Mirror`. `s3://` is refused: Orbax cannot checkpoint there."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path as LocalPath
from typing import Iterator, Union

from etils import epath

from neobert_jax import bucket, errors

Path = epath.Path
PathLike = Union[str, os.PathLike]
_S3_REFUSED = (
  's3:// is not supported: runs and their data go where their checkpoints can, and Orbax 0.12.8 '
  'writes checkpoints only to gs:// (its OCDBT layer refuses s3://); mount the bucket '
  '(mountpoint-s3 or s3fs-fuse) and pass the mount point, or use gs://'
)

# gcsfs logs a warning on every bucket access without a metadata server ("could not determine bucket type"):
# noise on every machine that authenticates by other means, and in the tests' emulator.
logging.getLogger('gcsfs').setLevel(logging.ERROR)


def is_url(path: PathLike) -> bool:
  return '://' in os.fspath(path)


def resolve(path: PathLike, what: str = 'path') -> epath.Path:
  """A user's path or URL as an epath.Path (local absolute, gs:// as given); another scheme is a ConfigError."""
  text = os.fspath(path)
  if not text:
    raise errors.ConfigError(f'{what} is empty')
  if is_url(text):
    if text.startswith('s3://'):
      raise errors.ConfigError(f'{what}={text}: {_S3_REFUSED}')
    if not text.startswith('gs://'):
      raise errors.ConfigError(f'{what}={text}: unsupported URL scheme; use a local path or gs://bucket/...')
    bucket.install()  # the one retry budget, before anything reaches the bucket through gcsfs
    return epath.Path(text.rstrip('/'))
  return epath.Path(LocalPath(text).expanduser().resolve())


def resolved(path: PathLike, what: str = 'path') -> epath.Path:
  """`path` as resolve gives it; an epath.Path is taken as already resolved."""
  return path if isinstance(path, epath.Path) else resolve(path, what)


def local(path: epath.Path) -> bool:
  return not is_url(path)


def write_bytes(path: epath.Path, data: bytes) -> None:
  """All or nothing; every file a job writes whole goes through here (numpy would misread a gs:// URL)."""
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
  """Creates `directory` if needed and writes a probe in it; StorageError (one line, the fix) when it cannot."""
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


def sha256(path: epath.Path) -> str:
  with path.open('rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


def copy(src: epath.Path, dst: epath.Path) -> None:
  """One file, any direction (local <-> bucket), in chunks."""
  if local(dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
  with src.open('rb') as fin, dst.open('wb') as fout:
    shutil.copyfileobj(fin, fout, 1 << 22)


def publish_dir(local_dir: PathLike, remote: epath.Path, marker: str) -> None:
  """Uploads `local_dir` to `remote` with `marker` last, so no reader takes a half upload for a finished one."""
  local_dir = LocalPath(local_dir)
  files = sorted(p.relative_to(local_dir).as_posix() for p in local_dir.rglob('*') if p.is_file())
  if marker not in files:
    raise ValueError(f'{local_dir} has no {marker} to commit it with')
  old = set(_files(remote))
  if marker in old:
    (remote / marker).unlink()
  for rel in [f for f in files if f != marker] + [marker]:
    copy(epath.Path(local_dir / rel), remote / rel)
  for rel in sorted(old - set(files)):
    (remote / rel).unlink()


def walk(directory: epath.Path) -> Iterator[epath.Path]:
  """The files below `directory`, level by level (epath refuses '**' globs on buckets)."""
  for p in directory.iterdir():
    if p.is_dir():
      yield from walk(p)
    else:
      yield p


def _files(root: epath.Path) -> list[str]:
  """Relative paths of the files under `root` (empty when it does not exist)."""
  prefix = len(os.fspath(root).rstrip('/')) + 1
  return sorted(os.fspath(p)[prefix:] for p in walk(root)) if root.exists() else []


def local_copy(source: PathLike, marker: str | None = None) -> LocalPath:
  """A local path for `source` (a bucket's is copied fresh); with `marker`, an incomplete directory is refused."""
  src = resolve(source)
  if local(src):
    return LocalPath(os.fspath(src))
  dst = cache_dir('downloads', url_key(src)) / src.name
  shutil.rmtree(dst, ignore_errors=True)
  if not src.is_dir():
    if not src.exists():
      raise FileNotFoundError(f'{src}: no such object')
    copy(src, epath.Path(dst))
    return dst
  names = _files(src)
  if marker is not None and marker not in names:
    raise FileNotFoundError(f'{src} has no {marker}: not a complete directory (an upload still running, or failed)')
  for rel in names:
    copy(src / rel, epath.Path(dst / rel))
  return dst


class Mirror:
  """A local directory standing in for `remote`; on a bucket `sync` uploads it and `pull` fetches it."""

  def __init__(self, remote: epath.Path, cache: PathLike):
    self.remote = remote
    self.path = LocalPath(os.fspath(remote)) if local(remote) else LocalPath(cache)
    self._sent: dict[str, tuple[int, int]] = {}

  def pull(self, names: tuple[str, ...]) -> None:
    """Starts the mirror afresh from the remote's `names`."""
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
    for f in sorted(p for p in self.path.rglob('*') if p.is_file()):
      rel, stat = f.relative_to(self.path).as_posix(), f.stat()
      if self._sent.get(rel) != (stat.st_size, stat.st_mtime_ns):
        copy(epath.Path(f), self.remote / rel)
        self._sent[rel] = (stat.st_size, stat.st_mtime_ns)
