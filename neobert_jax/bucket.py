"""What the bucket may cost a run: one retry budget (`window_s()` on a doubling backoff) for every client that
touches gs:// (gcsfs, tensorstore, our own `retry`), and the lines that say when the bucket struggles
(docs/leases.md, "The bucket's retry budget"). Imports only errors: paths.py imports it."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any, Callable, TypeVar

from neobert_jax import errors

log = logging.getLogger('neobert_jax.bucket')
T = TypeVar('T')

ENV_WINDOW = 'NEOBERT_BUCKET_RETRY_SECONDS'
ENV_SLOW = 'NEOBERT_BUCKET_SLOW_SECONDS'
DEFAULT_WINDOW_S = 300.0
DEFAULT_SLOW_S = 30.0
INITIAL_DELAY_S = 1.0
MAX_DELAY_S = 32.0
TENSORSTORE_RETRIES_METRIC = '/tensorstore/kvstore/gcs/retries'
# Transfers in flight: one GCS stream is limited well below a VM's network (tens to ~200 MB/s), so a few at once.
PARALLEL = 4


def window_s() -> float:
  """How long a failing bucket request is retried before its error reaches the job."""
  return float(os.environ.get(ENV_WINDOW) or DEFAULT_WINDOW_S)


def slow_s() -> float:
  return float(os.environ.get(ENV_SLOW) or DEFAULT_SLOW_S)


def delays(window: float | None = None) -> list[float]:
  """The backoff between tries: 1, 2, 4, ... up to 32 s, as many as the window holds (the last one cut to fit)."""
  window = window_s() if window is None else window
  out, delay = [], INITIAL_DELAY_S
  while sum(out) < window:
    out.append(min(delay, MAX_DELAY_S, window - sum(out)))
    delay *= 2
  return out


def tensorstore_retries() -> dict[str, Any]:
  """tensorstore's `gcs_request_retries` context resource for the same window and backoff."""
  window = window_s()
  initial, longest = min(INITIAL_DELAY_S, window), min(MAX_DELAY_S, max(window, 0.001))
  return {'max_retries': max(1, len(delays(window))), 'initial_delay': f'{initial:g}s', 'max_delay': f'{longest:g}s'}


_lock = threading.Lock()
_counted_retries = 0  # gcsfs's requests and `retry`'s calls (tensorstore counts its own)
_last_said = 0.0  # when the last "retrying" line was logged (one per episode: at most one a minute)
_down_since: float | None = None  # when a request last spent the whole window (or a save failed), until a success


def gave_up() -> None:
  """After a failed window requests are tried once (a stopping job fails fast) until one succeeds."""
  global _down_since
  _down_since = time.monotonic()


def _known_down() -> bool:
  return _down_since is not None and time.monotonic() - _down_since < window_s()


def retries() -> int:
  """Every retry of a storage request so far in this process: gcsfs's and `retry`'s, and tensorstore's metric."""
  try:
    import tensorstore  # pylint: disable=g-import-not-at-top

    found = tensorstore.experimental_collect_matching_metrics(TENSORSTORE_RETRIES_METRIC)
  except Exception:  # noqa: BLE001 - no tensorstore (prepare on a machine without it): nothing counted there
    found = []
  return _counted_retries + sum(int(v.get('value', 0)) for m in found for v in m.get('values', ()))


def _retried(error: BaseException, waited: float, what: str = 'a request') -> None:
  global _counted_retries, _last_said
  with _lock:
    _counted_retries += 1
    now = time.monotonic()
    say, _last_said = now - _last_said > 60, now if now - _last_said > 60 else _last_said
  if say:
    why = errors.one_line(error, first=True, with_type=True)[:200]
    log.warning(
      'bucket slow: %s failed (%s); retrying for up to %.0f s in all (%.0f s so far)', what, why, window_s(), waited
    )


class Timer:
  """Measures one bucket operation (`seconds`, `retries`) and says the one "bucket slow" line when it was slow."""

  def __init__(self, what: str, say: bool = True):
    self.what, self.say = what, say  # say: False for local storage (measured, never called a bucket)
    self.start, self.retries0 = time.monotonic(), retries()
    self.seconds, self.retries = 0.0, 0
    # A stall is said while it lasts, too: a slow bucket must not look like a hung job.
    self._watch = threading.Timer(slow_s(), self._still_running) if say else None
    if self._watch is not None:
      self._watch.daemon = True
      self._watch.start()

  def _still_running(self) -> None:
    seconds, tries = time.monotonic() - self.start, retries() - self.retries0
    log.warning('bucket slow: %s still running after %.0f s, %d retries so far', self.what, seconds, tries)

  def stop(self, say: bool = True) -> 'Timer':
    if self._watch is not None:
      self._watch.cancel()
    self.seconds, self.retries = time.monotonic() - self.start, retries() - self.retries0
    if say and self.say and (self.retries or self.seconds > slow_s()):
      log.warning('bucket slow: %s took %.0f s, %d retries', self.what, self.seconds, self.retries)
    return self

  def __enter__(self) -> 'Timer':
    return self

  def __exit__(self, *exc: Any) -> None:
    self.stop(say=exc[0] is None)


def _budgeted(raw: Callable[..., Any]) -> Callable[..., Any]:
  """gcsfs's retried coroutine `raw` on the window's budget instead of its 6 tries; a 4xx is raised at once."""
  from gcsfs import retry as gcsfs_retry  # pylint: disable=g-import-not-at-top

  async def call(*args: Any, **kwargs: Any) -> Any:
    global _down_since
    start, tries = time.monotonic(), 0
    pauses = [] if _known_down() else delays()
    while True:
      try:
        out = await raw(*args, **kwargs)
        _down_since = None
        return out
      except (asyncio.TimeoutError, *gcsfs_retry.RETRIABLE_EXCEPTIONS, gcsfs_retry.HttpError) as e:
        status = getattr(e, 'code', None) or getattr(e, 'status', None)
        retriable = isinstance(e, asyncio.TimeoutError) or gcsfs_retry.is_retriable(e)
        if status == 404 or not retriable or tries >= len(pauses):
          if retriable and pauses:
            gave_up()
          raise
        _retried(e, time.monotonic() - start)
        await asyncio.sleep(pauses[tries])
        tries += 1

  call.__name__ = getattr(raw, '__name__', 'call')
  call.__wrapped__ = raw
  return call


def install() -> None:
  """Puts the window into gcsfs (once; a no-op without gcsfs)."""
  try:
    from gcsfs import core  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  for name in ('_request', '_get_file_request', '_get_file_concurrent'):  # the methods gcsfs retries
    method = getattr(core.GCSFileSystem, name)
    if getattr(method, '_neobert_budget', False):
      continue
    budgeted = _budgeted(getattr(method, '__wrapped__', method))
    budgeted._neobert_budget = True
    setattr(core.GCSFileSystem, name, budgeted)


# Status words of tensorstore / gRPC / cloud storage errors that describe the storage, not the bytes stored.
_TRANSIENT_WORDS = (
  'UNAVAILABLE',
  'DEADLINE_EXCEEDED',
  'RESOURCE_EXHAUSTED',
  'ABORTED',
  'CANCELLED',
  'PERMISSION_DENIED',
  'UNAUTHENTICATED',
  'Connection reset',
  'Too many open files',
  'timed out',
  'Timeout',
)


def is_transient(error: BaseException) -> bool:
  """True for errors of the storage (retry them; the data is not damaged), False for missing or malformed data."""
  if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
    return False
  if isinstance(error, (OSError, TimeoutError, ConnectionError, MemoryError)):  # PermissionError is an OSError
    return True
  text = f'{type(error).__name__}: {error}'
  return any(w in text for w in _TRANSIENT_WORDS)


def retry(call: Callable[[], T], what: str, window: float | None = None) -> T:
  """call(), its transient errors retried on the budget's backoff for the window (or `window` s)."""
  start = time.monotonic()
  pauses = [] if _known_down() else delays(window)
  for tries in range(len(pauses) + 1):  # the last try returns or raises
    try:
      return call()
    except Exception as e:  # noqa: BLE001 - sorted by is_transient
      if not is_transient(e) or tries == len(pauses):
        if is_transient(e) and pauses:
          gave_up()
        raise
      _retried(e, time.monotonic() - start, what)
      time.sleep(pauses[tries])
