"""One writer per run: a lease (DIR/lease.json) on a workdir or a `prepare` output, renewed by a heartbeat, taken
atomically (GCS ifGenerationMatch, or a hard link locally) and taken over from a dead holder or by the same job
restarted (docs/leases.md). A holder whose lease was taken over is `lost`. Imports only errors and paths."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from neobert_jax import errors, paths

log = logging.getLogger(__name__)

LEASE_FILE = 'lease.json'
DEFAULT_TIMEOUT_S = 120.0
ENV_TIMEOUT = 'NEOBERT_LEASE_TIMEOUT'  # seconds; the tests use a few


def timeout_s() -> float:
  return float(os.environ.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT_S)


def pid_alive(pid: int) -> bool:
  """Whether process `pid` of this host exists (a reused pid reads as alive: the safe side)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _stamp(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')


@dataclasses.dataclass
class Holder:
  """The lease's content."""

  host: str
  pid: int
  job: str
  restart: int
  run_id: str
  started: float
  heartbeat: float
  timeout_s: float
  token: str

  @classmethod
  def mine(cls, run_id: str, timeout: float) -> 'Holder':
    """This process's lease; `job` and `restart` let a restarted job take it back at once ('' if it cannot)."""
    env = os.environ
    named = (('run_id', run_id), ('slurm job', env.get('SLURM_JOB_ID')), ('jobset', env.get('JOBSET_NAME')))
    job = next((f'{kind} {value}' for kind, value in named if value), '')  # the first that is set
    restart = env.get('SLURM_RESTART_COUNT') or env.get('JOBSET_RESTART_ATTEMPT') or '0'
    restart, now = int(restart) if restart.isdigit() else 0, time.time()
    return cls(socket.gethostname(), os.getpid(), job, restart, run_id, now, now, timeout, uuid.uuid4().hex)

  @classmethod
  def parse(cls, text: str) -> 'Holder':
    d = json.loads(text)
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})

  def text(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1) + '\n'

  def describe(self) -> str:
    ago = time.time() - self.heartbeat
    job = f', {self.job} (restart {self.restart})' if self.job else ''
    return (
      f'host {self.host}, pid {self.pid}{job}, started {_stamp(self.started)}, last heartbeat '
      f'{_stamp(self.heartbeat)} ({ago:.0f} s ago, timeout {self.timeout_s:.0f} s)'
    )


class Conflict(Exception):
  """The stored lease is not the one expected (someone else wrote it, or it is gone)."""


class _Local:
  def __init__(self, path: paths.Path):
    self.path = os.fspath(path)

  def read(self) -> tuple[str, Any] | None:
    try:
      with open(self.path, encoding='utf-8') as f:
        text = f.read()
    except FileNotFoundError:
      return None
    return text, text  # the version to compare against is the content itself

  def _written(self, text: str) -> str:
    tmp = f'{self.path}.tmp-{os.getpid()}-{threading.get_ident()}'
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(text)
    return tmp

  def create(self, text: str) -> Any:
    """Whole or not at all: written aside, then hard-linked in (fails if the name exists, never half-written)."""
    tmp = self._written(text)
    try:
      os.link(tmp, self.path)
    except FileExistsError:
      raise Conflict() from None
    except OSError:  # a filesystem without hard links: O_EXCL, then the content
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        raise Conflict() from None
      with os.fdopen(fd, 'w', encoding='utf-8') as f:
        f.write(text)
    finally:
      os.remove(tmp)
    return text

  def _expect(self, version: Any) -> None:
    current = self.read()
    if current is None or current[1] != version:
      raise Conflict()

  def replace(self, text: str, version: Any) -> Any:
    self._expect(version)
    os.replace(self._written(text), self.path)
    return text

  def delete(self, version: Any) -> None:
    self._expect(version)
    os.remove(self.path)


class _Bucket:
  """The GCS JSON API through gcsfs's own session (its credentials, endpoint and retry budget: bucket.py)."""

  def __init__(self, path: paths.Path):
    from urllib.parse import quote  # pylint: disable=g-import-not-at-top

    from etils.epath import backend  # pylint: disable=g-import-not-at-top

    # epath's own gcsfs instance: its session, and the listing cache that must forget an old lease.
    self.fs = backend.fsspec_backend.fs(os.fspath(path))
    self.bucket, _, self.key = os.fspath(path).removeprefix('gs://').partition('/')
    self.media = f'{self.fs._location}/download/storage/v1/b/{quote(self.bucket)}/o/{quote(self.key, safe="")}'
    self.upload = f'{self.fs._location}/upload/storage/v1/b/{quote(self.bucket)}/o'

  @staticmethod
  def _code(e: BaseException) -> int | None:
    return getattr(e, 'code', None) or getattr(e, 'status', None)

  def read(self) -> tuple[str, Any] | None:
    try:
      headers, body = self.fs.call('GET', self.media, alt='media')
    except FileNotFoundError:
      return None
    except Exception as e:  # noqa: BLE001 - gcsfs raises HttpError for 404 on some paths
      if self._code(e) == 404:
        return None
      raise
    return body.decode(), int(headers['x-goog-generation'])

  def create(self, text: str) -> Any:
    return self.replace(text, 0)

  def replace(self, text: str, version: Any) -> Any:
    try:
      out = self.fs.call(
        'POST',
        self.upload,
        uploadType='media',
        name=self.key,
        ifGenerationMatch=str(version),
        headers={'Content-Type': 'application/octet-stream'},
        data=text.encode(),
        json_out=True,
      )
    except Exception as e:  # noqa: BLE001
      if isinstance(e, FileExistsError) or self._code(e) in (412, 409):  # gcsfs raises FileExistsError for 412
        raise Conflict() from None
      raise
    finally:
      self.fs.invalidate_cache(f'{self.bucket}/{self.key}')  # gcsfs's listings must not keep an old lease
    return int(out['generation'])

  def delete(self, version: Any) -> None:
    try:
      self.fs.call('DELETE', 'b/{}/o/{}', self.bucket, self.key, ifGenerationMatch=str(version))
    except Exception as e:  # noqa: BLE001
      if isinstance(e, (FileExistsError, FileNotFoundError)) or self._code(e) in (412, 404):
        raise Conflict() from None
      raise
    finally:
      self.fs.invalidate_cache(f'{self.bucket}/{self.key}')


class Lease:
  """A held lease on `directory` (see the module docstring); a context manager that releases it on exit."""

  def __init__(self, directory: paths.Path, what: str, holder: Holder):
    self.directory, self.what, self.holder = directory, what, holder
    self.path = directory / LEASE_FILE
    self.store = _Local(self.path) if paths.local(self.path) else _Bucket(self.path)
    self.version: Any = None
    self.lost: str | None = None  # why, once another job took the lease over
    self.created = False  # the local directory was made for this lease: removed again if it stays empty
    self._stop = threading.Event()
    self._lock = threading.Lock()
    self._thread: threading.Thread | None = None

  def acquire(self) -> 'Lease':
    """Takes the lease or raises errors.InUseError naming the live holder and the fix."""
    for _ in range(5):  # another job may win a race in between; each turn reads what is there now
      with contextlib.suppress(Conflict):
        self.version = self.store.create(self.holder.text())
        break
      found = self.store.read()
      if found is None:
        continue  # released in between: try creating again
      text, version = found
      try:
        old = Holder.parse(text)
      except (ValueError, KeyError, TypeError):
        old = None  # unreadable: a lease written half by hand; nobody renews it, so it counts as stale
      why = self._takeover_reason(old)
      if why is None:
        raise self._refusal(old)
      try:
        self.version = self.store.replace(self.holder.text(), version)
      except Conflict:
        continue
      log.warning('took over the lease on %s=%s from %s: %s', self.what, self.directory, old and old.describe(), why)
      break
    else:
      raise errors.InUseError(f'{self.what}={self.directory}: the lease keeps changing hands; retry in a minute')
    self._thread = threading.Thread(target=self._heartbeat, name=f'lease {self.directory}', daemon=True)
    self._thread.start()
    return self

  def _takeover_reason(self, old: Holder | None) -> str | None:
    if old is None:
      return 'its lease file could not be read'
    if old.job and old.job == self.holder.job:
      if self.holder.restart < old.restart:
        return None  # a later attempt of this job holds it: this one is the straggler
      return f'the same job ({old.job}) restarted'
    if time.time() - old.heartbeat > old.timeout_s:
      return f'it stopped renewing it {time.time() - old.heartbeat:.0f} s ago (timeout {old.timeout_s:.0f} s)'
    if old.host == self.holder.host and old.pid != self.holder.pid and not pid_alive(old.pid):
      return f'its process {old.pid} on this host is gone (killed without a clean exit)'
    return None

  def _refusal(self, old: Holder) -> errors.InUseError:
    later = old.job and old.job == self.holder.job and self.holder.restart < old.restart
    why = 'a later restart of this job' if later else 'another job'
    return errors.InUseError(
      f'{self.what}={self.directory} is in use by {why}: {old.describe()}. Nothing was read or written. Wait '
      f'for it to finish, stop it, or use another {self.what}; a job killed without a clean exit gives the '
      f'lease up {old.timeout_s:.0f} s after its last heartbeat, and a restart of the same job (same SLURM '
      f'job id, JobSet, or --config.run_id) takes it back at once'
    )

  def _heartbeat(self) -> None:
    period = max(self.holder.timeout_s / 4, 0.05)
    while not self._stop.wait(period):
      self.renew()

  def renew(self) -> None:
    """Writes a fresh heartbeat; a lease taken over meanwhile marks this one lost (said once, as an error)."""
    with self._lock:
      if self.lost or self._stop.is_set():
        return
      self.holder.heartbeat = time.time()
      try:
        self.version = self.store.replace(self.holder.text(), self.version)
      except Conflict:
        found = self.store.read()
        who = Holder.parse(found[0]).describe() if found else 'nobody (the lease file was removed)'
        self.lost = f'the lease on {self.what}={self.directory} was taken over by {who}'
        log.error('%s; this job writes nothing more there', self.lost)
      except Exception as e:  # noqa: BLE001 - the storage is unreachable: keep trying, the bucket budget logs it
        log.warning('renewing the lease on %s failed (%s); trying again', self.directory, errors.one_line(e))

  def check(self) -> None:
    """errors.InUseError once the lease was taken over by another job: it must not write the run any more."""
    if self.lost:
      raise errors.InUseError(f'{self.lost}; this job stopped without writing. Nothing it saved before was lost.')

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
    with self._lock:
      if self.lost or self.version is None:
        return
      try:
        self.store.delete(self.version)
      except Conflict:
        pass
      except Exception as e:  # noqa: BLE001 - it expires by itself; the run's own outcome matters more
        log.warning('could not release the lease %s (%s); it expires by itself', self.path, errors.one_line(e))
      self.version = None
    if self.created:
      with contextlib.suppress(OSError):
        os.rmdir(os.fspath(self.directory))  # a refused run leaves no empty directory behind

  def __enter__(self) -> 'Lease':
    return self

  def __exit__(self, *exc: Any) -> None:
    self.release()


def acquire(directory: paths.PathLike, what: str, run_id: str = '', timeout: float | None = None) -> Lease:
  """The lease on `directory` (`what`: its flag); InUseError when a live job holds it."""
  directory = paths.resolved(directory, what)
  created = paths.local(directory) and not directory.exists()
  try:
    if created:
      directory.mkdir(parents=True, exist_ok=True)
    lease = Lease(directory, what, Holder.mine(run_id, timeout or timeout_s()))
    lease.created = created
    return lease.acquire()
  except Exception as e:  # noqa: BLE001 - a live holder; a read-only disk, a missing bucket, refused credentials
    if created and directory.exists():
      directory.rmdir()
    if isinstance(e, errors.NeobertError):
      raise
    paths.check_writable(directory, what)  # the one line for those, when that is what it is
    raise errors.StorageError(f'{what}={directory}: the lease could not be taken ({errors.one_line(e)})') from e
