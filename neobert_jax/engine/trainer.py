"""The one training loop: step, log, run hooks (evaluation, checkpoints), stop cleanly on SIGTERM. Exact resume: a
step's batch is pulled just before the step runs, nothing prefetched beyond the iterator's own buffers, so after
step s the iterator has handed out exactly s batches, the position a checkpoint saves."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np

from neobert_jax.engine.metrics import MetricsWriter
from neobert_jax.errors import TrainingDiverged

log = logging.getLogger('neobert_jax.engine')
# Step metrics that are logged as the latest value rather than averaged over the logging window.
_LATEST = ('param_norm', 'learning_rate')


@dataclasses.dataclass(frozen=True)
class LogOptions:
  """What a task tells the Logger: nan_policy 'stop' or 'skip', FLOPs for MFU, check(step, host metrics) on
  every step (reading the unlogged check_keys), counts(done) for host figures in each log line."""

  nan_policy: str = 'stop'
  diverged_hint: str = ''
  flops_per_token: float | None = None
  peak_flops: float | None = None
  check: Callable[[int, dict], None] | None = None
  check_keys: tuple[str, ...] = ()
  counts: Callable[[int], dict[str, float]] | None = None


class Logger:
  """Per-step device metrics turned into host scalars every few steps (one device sync); hooks write here."""

  def __init__(self, writer: MetricsWriter, pbar: Any, options: LogOptions, last_good: Callable[[], str]):
    self.writer, self.pbar, self.options, self.last_good = writer, pbar, options, last_good
    # Step metrics that are checks, not curves: `finite` is the policy's, check_keys the caller's `check`'s.
    self.not_logged = ('finite',) + tuple(options.check_keys)
    self.peak_flops = options.peak_flops  # raised to the rate a run achieves (flush)
    self.pending: list[tuple[int, dict[str, Any]]] = []
    self.skipped = 0
    self.throughput: list[float] = []  # tokens/s of every logged window that held timed steps
    self.restart_clock()

  def evaluated(self, step: int, figures: dict[str, float], line: str, prefix: str = 'eval') -> None:
    """An evaluation hook's figures: written under `prefix`, and `line` said on process 0 (past the progress bar)."""
    self.writer.write(step, figures, prefix=prefix)
    if jax.process_index() == 0:
      (self.pbar.write if self.pbar is not None else log.info)(line)

  def add(self, step: int, metrics: dict[str, Any], tokens: int) -> None:
    self.pending.append((step, metrics))
    self.tokens += tokens
    self.timed += 1

  def restart_clock(self) -> None:
    """Excludes compilation (and evaluation / checkpoint pauses) from throughput."""
    self.resume_clock()
    self.banked = (0.0, 0, 0)  # (seconds, tokens, steps) timed before a pause in this window

  def pause_clock(self) -> None:
    """Banks the window's timed steps; steps added until resume_clock (a recompile) are not timed."""
    seconds, tokens, timed = self.banked
    self.banked = (seconds + time.perf_counter() - self.t0, tokens + self.tokens, timed + self.timed)
    self.tokens = self.timed = 0

  def resume_clock(self) -> None:
    """Times again from now, keeping what pause_clock banked."""
    self.t0, self.tokens, self.timed = time.perf_counter(), 0, 0

  def flush(self) -> None:
    if not self.pending:
      return
    host = jax.device_get([m for _, m in self.pending])
    steps = [s for s, _ in self.pending]
    o = self.options
    for s, m in zip(steps, host):
      if o.check is not None:
        o.check(s, m)
      if bool(m['finite']):
        continue
      if o.nan_policy == 'stop':
        raise TrainingDiverged(
          f'non-finite loss/gradient at step {s} (loss={float(m["loss"])}, grad_norm={float(m["grad_norm"])}). '
          f'Last good checkpoint: {self.last_good()}. {o.diverged_hint}'
        )
      self.skipped += 1
      log.warning('step %d: non-finite loss/gradient, update skipped (%d so far)', s, self.skipped)
    elapsed = max(time.perf_counter() - self.t0 + self.banked[0], 1e-9)
    tokens, timed = self.tokens + self.banked[1], self.timed + self.banked[2]
    tps = tokens / elapsed
    out = {k: float(np.mean([float(m[k]) for m in host])) for k in host[0] if k not in _LATEST + self.not_logged}
    out.update({k: float(host[-1][k]) for k in _LATEST if k in host[-1]})
    if o.counts is not None:
      out.update(o.counts(steps[-1]))
    if timed:  # a window of only compiling steps (the first, a new batch shape) has no throughput to report
      out.update(tokens_per_sec=tps, step_time=elapsed / timed)
      self.throughput.append(tps)
      if self.peak_flops and o.flops_per_token:
        # A peak measured at start-up under load is below what the device does once the load lifts: the rate a
        # run achieves is a lower bound of the peak, so MFU never reads above 100%.
        self.peak_flops = max(self.peak_flops, tps * o.flops_per_token)
        out['mfu'] = tps * o.flops_per_token / self.peak_flops
    self.writer.write(steps[-1], out)
    if self.pbar is not None:
      post = {'loss': f'{out["loss"]:.3f}', 'lr': f'{out["learning_rate"]:.2e}', 'tok/s': f'{tps:,.0f}'}
      if 'mfu' in out:
        post['mfu'] = f'{100 * out["mfu"]:.1f}%'
      self.pbar.set_postfix(post, refresh=False)
    self.pending = []
    self.restart_clock()


class Preemption:
  """Stops for SIGTERM after the same step in every process (one that saved alone would wait in its barrier):
  jax's preemption service agrees when on (a Python handler would replace its notifier), else an all-gather."""

  def __init__(self, mngr: Any, agree_every: int):
    self._mngr, self._agree_every = mngr, max(1, agree_every)
    self._multi = jax.process_count() > 1
    # jax.distributed runs its preemption sync manager (its own SIGTERM notifier, a common stop step) exactly when
    # this option is on (see multihost_utils.reached_preemption_sync_point).
    self._jax_service = self._multi and jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service
    self.requested = False  # this process got SIGTERM (the Python handler's flag)
    self._previous = None

  def __enter__(self) -> 'Preemption':
    if not self._jax_service and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, lambda *_: setattr(self, 'requested', True))
    return self

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


def compile_ahead(step: Any, state: Any, batch_spec: Any) -> threading.Thread:
  """Compiles `step` for `state` and `batch_spec` (the first batch's ShapeDtypeStructs) on a thread that overlaps
  the hooks' set-up and step-0 evaluation; jit keeps the executable for the first step. Join it before that step
  (else the step compiles again beside it); a failure is left for the first step to raise."""

  def compile_step() -> None:
    try:
      step.lower(state, batch_spec).compile()  # reads the arrays' shapes and shardings only
    except Exception:  # pylint: disable=broad-except
      log.debug('compiling ahead failed; the first step compiles', exc_info=True)

  thread = threading.Thread(target=compile_step, name='compile-ahead', daemon=True)
  thread.start()
  return thread


@dataclasses.dataclass(frozen=True)
class Hook:
  """fn(step, state, logger) every `every` steps and after the last; `checkpoint` hooks also run on preemption."""

  fn: Callable[[int, Any, Logger], None]
  every: int
  checkpoint: bool = False


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
  """What a task asks of the loop: hooks, checkpoint_every, agreed SIGTERM stop, `profile` = (first step, steps;
  first < 0: none), last_good() for the divergence message, on_step(done) after every step (tests crash with it)."""

  num_steps: int
  log_every: int = 1
  hooks: tuple[Hook, ...] = ()
  checkpoint_every: int | None = None
  preemption: bool = False
  profile: tuple[int, int] = (-1, 0)
  last_good: Callable[[], str] | None = None
  desc: str = 'train'
  on_step: Callable[[int], None] | None = None
  log: LogOptions = LogOptions()


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """Where training stopped: final state and step, preempted, skipped updates, tokens/s per logged window."""

  state: Any
  final_step: int
  preempted: bool
  skipped_steps: int
  throughput: tuple[float, ...]


@dataclasses.dataclass(eq=False)
class Trainer:
  """Runs `step(state, batch[, key])` over `batches` ((batch, real tokens[, key])) up to options.num_steps."""

  step: Callable
  state: Any
  batches: Iterator[tuple]
  start: int
  options: TrainerOptions
  logger: Logger
  preemption: Preemption | None = None
  profile_dir: Callable[[], Path] | None = None

  def train(self) -> TrainResult:
    """Trains to num_steps or a preemption stop; a step that compiles (a new batch shape) is not timed."""
    o = self.options
    first, count = o.profile
    shape, done, preempted = None, self.start, False
    for step in range(self.start, o.num_steps):
      if step == first:
        jax.profiler.start_trace(str(self.profile_dir()))
      batch, tokens, *key = next(self.batches)
      new_shape = jax.tree.leaves(batch)[0].shape
      recompiles = shape is not None and new_shape != shape
      if recompiles:
        jax.block_until_ready(self.state)
        self.logger.pause_clock()
      shape = new_shape
      self.state, metrics = self.step(self.state, batch, *key)
      done = step + 1
      self.logger.add(done, metrics, tokens)
      if first >= 0 and step == first + count - 1:
        jax.block_until_ready(self.state)
        jax.profiler.stop_trace()
      if step == self.start or recompiles:  # the step compiled: time the steps from here
        jax.block_until_ready(metrics)
        (self.logger.restart_clock if step == self.start else self.logger.resume_clock)()
      if self.logger.pbar is not None:
        self.logger.pbar.update(1)
      if done % max(1, o.log_every) == 0 or done == o.num_steps:
        self.logger.flush()
      stop = self.preemption is not None and self.preemption.should_stop(done)
      for hook in o.hooks:
        due = hook.every > 0 and (done % hook.every == 0 or done == o.num_steps)
        if due or (stop and hook.checkpoint):
          self.logger.flush()  # never act on (evaluate, checkpoint) a state that went non-finite
          hook.fn(done, self.state, self.logger)
          if not hook.checkpoint:
            self.logger.restart_clock()
      if o.on_step is not None:
        o.on_step(done)
      if stop:
        preempted = True
        break
    return TrainResult(self.state, done, preempted, self.logger.skipped, tuple(self.logger.throughput))
