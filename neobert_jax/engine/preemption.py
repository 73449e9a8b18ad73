"""Stopping on SIGTERM so that every process stops, and saves, after the same step."""

from __future__ import annotations

import signal
import threading
from typing import Any

import jax
import numpy as np


def _jax_preemption_service() -> bool:
  """True when jax's preemption sync manager runs (jax.distributed with jax_enable_preemption_service, the
  default): it installs its own SIGTERM notifier and agrees a common stop step across processes."""
  # Public equivalent of "jax's preemption sync manager exists": jax.distributed starts it exactly when this
  # option is on (see multihost_utils.reached_preemption_sync_point).
  return jax.process_count() > 1 and jax.distributed.is_initialized() and bool(jax.config.jax_enable_preemption_service)


class Preemption:
  """Decides when to stop for SIGTERM so that every process stops, and saves, after the same step.

  A process-local flag is not enough with several processes: one that starts a save alone waits forever in its
  barrier. With jax's preemption service `reached_preemption(step)` agrees (and no Python handler is installed:
  it would replace jax's notifier); without it the flag is all-gathered every `agree_every` steps."""

  def __init__(self, mngr: Any, agree_every: int):
    self._mngr, self._agree_every = mngr, max(1, agree_every)
    self._multi = jax.process_count() > 1
    self._jax_service = _jax_preemption_service()
    self.requested = False  # this process got SIGTERM (the Python handler's flag)
    self._previous = None

  def __enter__(self) -> 'Preemption':
    if not self._jax_service and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum: int, frame: Any) -> None:
    del signum, frame
    self.requested = True

  def should_stop(self, done: int) -> bool:
    """Called by every process after every step; the same answer in all of them."""
    if not self._multi:
      return self.requested
    if self._jax_service:
      return bool(self._mngr.reached_preemption(done))
    if done % self._agree_every:
      return False
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(self.requested))).any())

  def __exit__(self, *exc: Any) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
