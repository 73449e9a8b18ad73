"""A training session: one command's time in a workdir, assembled in one place (docs/architecture.md). It closes
everything it opened in reverse order through one ExitStack; a clean exit first waits for the saves in flight."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, TypeVar

import jax
import ml_collections
import numpy as np

from neobert_jax import bucket, errors, paths
from neobert_jax import lease as lease_lib
from neobert_jax.config.model import require_resolved
from neobert_jax.engine import checkpoint as ckpt
from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.engine import state as state_lib
from neobert_jax.engine.metrics import MetricsWriter
from neobert_jax.weights import runs
from neobert_jax.weights import source as source_lib

log = logging.getLogger('neobert_jax.engine')
T = TypeVar('T')
StateMaker = Callable[[], tuple[state_lib.StateDefs, state_lib.TrainState]]


def check_workdir(workdir: paths.Path, writable: bool = True) -> None:
  """A workdir that is a file, or (with `writable`) cannot be written, is one line now, not a traceback later."""
  if paths.local(workdir) and workdir.exists() and not workdir.is_dir():
    raise errors.ConfigError(
      f'--workdir={workdir} is a file, not a directory; pass a directory for the run (it is created if missing)'
    )
  if writable and jax.process_index() == 0:
    paths.check_writable(workdir, '--workdir')


@contextlib.contextmanager
def claim(workdir: str | Path, run_id: str = '') -> Iterator[lease_lib.Lease | None]:
  """The workdir's lease, held by process 0; a refusal stops every process with one line, no hang."""
  workdir = paths.resolved(workdir, '--workdir')
  check_workdir(workdir, writable=False)  # the one line for a workdir that is a file
  held, refused = None, None
  if jax.process_index() == 0:
    try:
      held = lease_lib.acquire(workdir, '--workdir', run_id)
    except errors.NeobertError as e:
      refused = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    ok = multihost_utils.process_allgather(np.int32(refused is None))
    if refused is None and not bool(np.asarray(ok).reshape(-1)[0]):
      refused = errors.InUseError(f'--workdir={workdir}: process 0 could not take its lease (see its error line)')
  if refused is not None:
    raise refused
  try:
    yield held
  finally:
    if held is not None:
      held.release()


@dataclasses.dataclass(frozen=True)
class Start:
  """Where a run's state comes from: `step` optimizer steps already taken (0 unless `resumed`)."""

  step: int
  defs: state_lib.StateDefs
  state: state_lib.TrainState
  resumed: bool
  origin: str  # for the log: 'checkpoint DIR/STEP', the init source, or 'fresh parameters'


class TrainingSession:
  """One session of training in `workdir`; `lease` is checked before every save."""

  def __init__(
    self,
    workdir: str | Path,
    cfg: ml_collections.ConfigDict,
    *,
    data_position: ckpt.DataPosition | None = None,
    keep: int = 3,
    async_save: bool = True,
    lease: lease_lib.Lease | None = None,
    wandb: Any = None,
  ):
    require_resolved(cfg.model)  # every checkpoint records this config: the kernel it ran, never 'auto'
    self.workdir = paths.resolved(workdir, '--workdir')
    self.lease = lease  # checked before every save: a job whose lease was taken over writes nothing more
    self.cfg, self.data_position, self.wandb = cfg, data_position, wandb
    self.keep, self.async_save = keep, async_save
    self.is_main = jax.process_index() == 0
    self.saved_step = -1  # the newest step this run saved (or resumed from)
    self.committed_step: int | None = None  # the newest step known complete: resumed from, or seen to commit
    self.mngr = None
    self._writer: MetricsWriter | None = None
    self._in_flight: tuple[int, bucket.Timer] | None = None  # the save Orbax is committing, with its timer
    self._timings: collections.deque = collections.deque()  # (step, times) per checkpoint; Orbax's thread appends
    self._stack = contextlib.ExitStack()

  def __enter__(self) -> 'TrainingSession':
    self._stack.__enter__()
    self.mngr = ckpt.make_manager(self.workdir, self.keep, self.async_save, on_saved=self._committed)
    self.on_close(ckpt.close, self.mngr)
    return self

  def __exit__(self, *exc: Any) -> bool:
    if exc[0] is None:
      try:
        ckpt.finish(self.mngr, self.committed_step)  # a failed background save is the run's error, not a log line
        self._write_timings()
      except BaseException:
        self._forget_in_flight()
        if not self._stack.__exit__(*sys.exc_info()):
          raise
        return False
    self._forget_in_flight()
    return bool(self._stack.__exit__(*exc))

  def _forget_in_flight(self) -> None:
    """A save that will not commit is neither timed nor said to be running."""
    done, self._in_flight = self._in_flight, None
    if done is not None:
      done[1].stop(say=False)

  def hold(self, context: ContextManager[T]) -> T:
    """Enters `context` now and exits it when the run closes."""
    return self._stack.enter_context(context)

  def on_close(self, fn: Callable[..., Any], *args: Any) -> None:
    """Calls fn(*args) when the run closes, before whatever was opened earlier is closed."""
    self._stack.callback(fn, *args)

  @property
  def writer(self) -> MetricsWriter:
    """The metrics, opened on first use (a refused resume writes nothing), closed at the end."""
    if self._writer is None:
      failed = lambda e: self._upload_failed(e, 'writing the metrics under', 'Free space or fix the storage')
      self._writer = MetricsWriter(self.workdir, self.cfg.logging.tensorboard, self.wandb, on_storage_error=failed)
      self.on_close(self._close_writer)
    return self._writer

  def _close_writer(self) -> None:
    """A failed last upload is one StorageError line, or a warning while another error is on its way out."""
    failing = sys.exc_info()[1]
    try:
      self._writer.close()
    except Exception as e:  # noqa: BLE001 - gcsfs raises its own types once the retry window is spent
      if failing is not None:
        log.warning('the last upload of the metrics to %s failed too (%s)', self.workdir, errors.one_line(e))
        return
      raise self._upload_failed(e) from e

  def _upload_failed(
    self, e: BaseException, what: str = 'uploading the metrics to', fix: str = 'Fix the storage'
  ) -> errors.StorageError:
    return errors.StorageError(
      f'{what} {self.workdir} failed ({errors.one_line(e)}); {ckpt.kept(self.mngr, self.committed_step)}. {fix}, '
      'then re-run the same command to resume from it.'
    )

  def profile_dir(self) -> Path:
    """WORKDIR/profile; on a bucket, the metrics mirror (process 0) or the local cache."""
    if paths.local(self.workdir):
      return Path(self.workdir) / 'profile'
    where = self.writer.local_dir or paths.cache_dir('profile', paths.url_key(self.workdir))
    log.info('profile trace of process %d: %s', jax.process_index(), where / 'profile')
    return where / 'profile'

  def restore_or_init(
    self,
    abstract: StateMaker,
    create: StateMaker,
    *,
    resume: bool = True,
    source: Callable[[], source_lib.Source | None] = lambda: None,
    place: Callable[[source_lib.Source, Any], Any] = lambda src, params: src.sharded(params),
    keep_optimizer: bool = False,
    continue_data: bool = False,
  ) -> Start:
    """This workdir's newest checkpoint (with `resume`), else create() with `source()`'s weights if any."""
    if resume:
      defs, target = abstract()
      restored = ckpt.restore_latest(self.mngr, target, self.data_position)
      if restored is not None:
        step, state = restored
        self.saved_step = self.committed_step = step
        if self.is_main:
          log.info('resumed from %s/%d', self.mngr.directory, step)
        return Start(step, defs, state, True, f'checkpoint {self.mngr.directory}/{step}')
    src = source()
    defs, state = create()
    if src is None:
      return Start(0, defs, state, False, 'fresh parameters')
    state = state_lib.with_params(defs, place(src, state['params']))
    origin = src.where + (f' step {src.step}' if src.step is not None else '')
    origin += ' (its moving average)' if src.item == runs.EMA_ITEM else ''
    log.info('initialised parameters from %s', origin)
    if src.kind == 'run' and (keep_optimizer or continue_data):
      opt = ckpt.restore_stage(
        runs.checkpoint_dir(src.path), src.step, state, self.data_position, optimizer=keep_optimizer, data=continue_data
      )
      if opt is not None:
        state = {**state, 'opt': state_lib.restart_schedule(opt)}
      carried = (('the optimizer state', keep_optimizer), ('the data position', continue_data))
      log.info('carried over from %s: %s', origin, ' and '.join(what for what, on in carried if on))
    return Start(0, defs, state, False, origin)

  def save(self, step: int, state: state_lib.TrainState) -> None:
    """The full state (parameters, optimizer, data position, config) as `step`; metrics go up with it."""
    self._save(step, state, full=True)
    with bucket.Timer(f'checkpoint {step} metrics upload', say=not paths.local(self.workdir)) as upload:
      try:
        self.writer.sync()  # a bucket workdir's metrics and TensorBoard go up with each checkpoint
      except Exception as e:  # noqa: BLE001 - gcsfs raises its own types once the retry window is spent
        raise self._upload_failed(e) from e
    self._timings.append((step, {'upload_seconds': upload.seconds, 'upload_retries': upload.retries}))

  def save_params(self, step: int, state: state_lib.TrainState) -> None:
    """Parameters and config only, as `step` (fine-tuning's best evaluation: what its export reads)."""
    self._save(step, state, full=False)

  def _save(self, step: int, state: state_lib.TrainState, full: bool) -> None:
    """Starts the save (`full`: resumable), timed to its commit (`_committed`), unless this job lost its lease."""
    if self.lease is not None:
      self.lease.check()
    if self._in_flight is not None:
      ckpt.finish(self.mngr, self.committed_step)  # what Orbax's save does first anyway: the previous one commits
    self._write_timings()  # the saves committed since the last one, under their own steps
    self._in_flight = (step, bucket.Timer(f'checkpoint {step} save', say=not paths.local(self.workdir)))
    try:
      position = self.data_position if full else None
      ckpt.save(self.mngr, step, state, position, self.cfg, with_optimizer=full, last_good=self.committed_step)
    except BaseException:
      self._forget_in_flight()
      raise
    if not self.async_save:
      self._committed()
    self.saved_step = step

  def _committed(self) -> None:
    """A save has committed (Orbax's thread, for an async one): its duration and retries, said when slow."""
    done, self._in_flight = self._in_flight, None
    if done is not None:
      timer = done[1].stop()
      self.committed_step = done[0]
      self._timings.append((done[0], {'save_seconds': timer.seconds, 'save_retries': timer.retries}))

  def _write_timings(self) -> None:
    """checkpoint/save_seconds, save_retries, upload_seconds, upload_retries, per checkpoint."""
    while self._timings:
      step, values = self._timings.popleft()
      self.writer.write(step, values, prefix='checkpoint')

  def last_good(self) -> str:
    """The newest complete checkpoint, for the divergence message (waits for the saves in flight)."""
    ckpt.finish(self.mngr)
    s = self.mngr.latest_step()
    return f'{self.mngr.directory}/{s}' if s is not None else 'none (no checkpoint was written yet)'

  def save_final(self, result: trainer_lib.TrainResult) -> None:
    """Saves where training stopped unless that step is saved already (or nothing was trained)."""
    if result.preempted and self.is_main:
      log.warning('SIGTERM: saved checkpoint %s/%d, exiting', self.mngr.directory, result.final_step)
    if result.final_step != self.saved_step and result.final_step > 0:
      self.save(result.final_step, result.state)

  def trainer(
    self, step: Callable, start: Start, batches: Iterator[tuple], options: trainer_lib.TrainerOptions
  ) -> trainer_lib.Trainer:
    """engine/trainer.Trainer from `start` (its state donated) with the task's hooks, then the checkpoint hook."""
    pbar = None
    if self.is_main and self.cfg.logging.progress_bar:
      from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

      pbar = tqdm(total=options.num_steps, initial=start.step, desc=options.desc, unit='step', dynamic_ncols=True)
      self.on_close(pbar.close)
    if options.checkpoint_every is not None:
      # `save` every `checkpoint_every` steps, after the last one and on preemption.
      saves = trainer_lib.Hook(lambda done, state, _: self.save(done, state), options.checkpoint_every, checkpoint=True)
      options = dataclasses.replace(options, hooks=(*options.hooks, saves))
    return trainer_lib.Trainer(
      step,
      start.state,
      batches,
      start.step,
      options,
      trainer_lib.Logger(self.writer, pbar, options.log, options.last_good or self.last_good),
      self.hold(trainer_lib.Preemption(self.mngr, options.log_every)) if options.preemption else None,
      self.profile_dir,
    )
