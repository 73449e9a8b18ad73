"""The training loop: resume or initialise, step, log, evaluate, checkpoint, stop cleanly on SIGTERM.

Order of work matters for exact resume: a step's batch is pulled from the data iterator immediately before the
step runs and nothing is prefetched beyond Grain's own buffers, so when checkpoint <step> is saved the iterator has
handed out exactly <step> batches and its saved position is where the resumed run must continue.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from neobert_jax import paths
from neobert_jax import sharding as shd
from neobert_jax.errors import DataError
from neobert_jax.data import pipeline
from neobert_jax.train import batches as batches_lib
from neobert_jax.train import checkpoint as ckpt
from neobert_jax.train import config as config_lib
from neobert_jax.train import init as init_lib
from neobert_jax.train import metrics as metrics_lib
from neobert_jax.train import resume as resume_lib
from neobert_jax.train import state as state_lib
from neobert_jax.train import step as step_lib

log = logging.getLogger('neobert_jax.train')


class TrainingDiverged(RuntimeError):
  """The loss or gradient norm became NaN/inf under train.nan_policy='stop'."""


@dataclasses.dataclass
class RunResult:
  workdir: Path
  final_step: int
  preempted: bool = False
  evals: list[dict[str, float]] = dataclasses.field(default_factory=list)   # {'step', 'loss', 'accuracy'}
  last_train: dict[str, float] = dataclasses.field(default_factory=dict)
  skipped_steps: int = 0
  # train/report.py's unigram baseline and fill-mask examples, filled in by neobert_jax/pretrain.py after the export
  report: dict[str, Any] = dataclasses.field(default_factory=dict)


def _jax_preemption_service() -> bool:
  """True when jax's preemption sync manager runs (jax.distributed with jax_enable_preemption_service, the
  default): it installs its own SIGTERM notifier and agrees a common stop step across processes."""
  # Public equivalent of "jax's preemption sync manager exists": jax.distributed starts it exactly when this
  # option is on (see multihost_utils.reached_preemption_sync_point).
  return (jax.process_count() > 1 and jax.distributed.is_initialized()
          and bool(jax.config.jax_enable_preemption_service))


class _Preemption:
  """Decides when to stop for SIGTERM (preemption) so that every process stops, and saves, after the same step.

  One process: a Python SIGTERM handler sets a flag, polled after every step.
  Several processes: a process-local flag is not enough (processes get the signal at different steps, and one that
  starts a checkpoint save alone waits forever for the others in its barrier), so the decision is agreed:
    * with jax's preemption service (on by default under jax.distributed): jax's own SIGTERM notifier passes the
      notice to every process and `reached_preemption(step)` (called by every process after every step) is True
      in all of them at the same step. No Python handler is installed: it would replace jax's notifier.
    * without it: the Python flag is all-gathered every `agree_every` steps and every process stops at the first
      such step where any process has it.
  """

  def __init__(self, mngr: Any, agree_every: int):
    self._mngr, self._agree_every = mngr, max(1, agree_every)
    self._multi = jax.process_count() > 1
    self._jax_service = _jax_preemption_service()
    self.requested = False  # this process got SIGTERM (the Python handler's flag)
    self._previous = None

  def __enter__(self) -> '_Preemption':
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


def _evaluate(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, eval_step: Any, params: Any) -> dict[str, float]:
  host = pipeline.make_eval_iterator(
      cfg.data, batches_lib.local_eval_batch_size(cfg), int(cfg.model.max_length), seed=int(cfg.seed),
      process_index=jax.process_index(), process_count=jax.process_count(), num_batches=int(cfg.eval.num_batches),
      model_vocab_size=int(cfg.model.vocab_size))
  keys = step_lib.batch_keys(cfg)
  sums = []
  for b in host:
    sums.append(eval_step(params, batches_lib.to_global(b, keys, mesh, 1)))
  total = jax.device_get(sums)
  count = max(sum(float(s['count']) for s in total), 1.0)
  return {'loss': sum(float(s['loss_sum']) for s in total) / count,
          'accuracy': sum(float(s['correct']) for s in total) / count}


class _Logger:
  """Collects per-step device metrics and turns them into host scalars only every log_every steps."""

  def __init__(self, cfg: ml_collections.ConfigDict, writer: metrics_lib.MetricsWriter, pbar: Any):
    self.cfg, self.writer, self.pbar = cfg, writer, pbar
    self.fpt = metrics_lib.flops_per_token(cfg)
    self.peak, self.peak_source = metrics_lib.total_peak_flops(cfg)
    self.pending: list[tuple[int, dict[str, Any]]] = []
    self.restart_clock()
    self.skipped = 0
    self.last: dict[str, float] = {}

  def add(self, step: int, metrics: dict[str, Any], tokens: int) -> None:
    self.pending.append((step, metrics))
    self.tokens += tokens
    self.timed += 1

  def restart_clock(self) -> None:
    """Excludes compilation (and evaluation / checkpoint pauses) from throughput."""
    self.t0 = time.perf_counter()
    self.tokens = 0
    self.timed = 0

  def flush(self, last_good: Callable[[], str]) -> None:
    if not self.pending:
      return
    host = jax.device_get([m for _, m in self.pending])
    steps = [s for s, _ in self.pending]
    for s, m in zip(steps, host):
      if int(m.get('rows_over_document_limit', 0)):
        raise DataError(
            f'step {s}: {int(m["rows_over_document_limit"])} packed rows hold more documents than '
            f'data.max_documents_per_row={self.cfg.data.max_documents_per_row}, which the packed attention layout '
            f'cannot represent. Data from this pipeline never does; raise --config.data.max_documents_per_row '
            f'or pack your batches with that limit.')
      if not bool(m['finite']):
        if self.cfg.train.nan_policy == 'stop':
          raise TrainingDiverged(
              f'non-finite loss/gradient at step {s} (loss={float(m["loss"])}, grad_norm={float(m["grad_norm"])}). '
              f'Last good checkpoint: {last_good()}. Re-running the same command resumes from it; consider a '
              f'lower --config.optimizer.peak_lr, or --config.train.nan_policy=skip to drop such steps.')
        self.skipped += 1
        log.warning('step %d: non-finite loss/gradient, update skipped (%d so far)', s, self.skipped)
    elapsed = max(time.perf_counter() - self.t0, 1e-9)
    mean = lambda k: float(np.mean([float(m[k]) for m in host]))
    tps = self.tokens / elapsed
    out = {'loss': mean('loss'), 'accuracy': mean('accuracy'), 'grad_norm': mean('grad_norm'),
           'param_norm': float(host[-1]['param_norm']), 'learning_rate': float(host[-1]['learning_rate']),
           'tokens_per_sec': tps, 'step_time': elapsed / max(self.timed, 1), 'masked_tokens': mean('masked_tokens')}
    if self.peak:
      out['mfu'] = tps * self.fpt / self.peak
    self.writer.write(steps[-1], out)
    if self.pbar is not None:
      post = {'loss': f'{out["loss"]:.3f}', 'lr': f'{out["learning_rate"]:.2e}', 'tok/s': f'{tps:,.0f}'}
      if 'mfu' in out:
        post['mfu'] = f'{100 * out["mfu"]:.1f}%'
      self.pbar.set_postfix(post, refresh=False)
    self.last = out
    self.pending = []
    self.restart_clock()


def _profile_dir(workdir: paths.Path, writer: metrics_lib.MetricsWriter) -> Path:
  """WORKDIR/profile; for a bucket workdir, process 0 traces into the metrics mirror (uploaded with it) and the
  others into this machine's cache (the profiler writes local files)."""
  if paths.local(workdir):
    return Path(workdir) / 'profile'
  where = writer.local_dir or paths.cache_dir('profile', paths.url_key(workdir))
  log.info('profile trace of process %d: %s', jax.process_index(), where / 'profile')
  return where / 'profile'


def run(cfg: ml_collections.ConfigDict, workdir: str | Path,
        on_step: Callable[[int], None] | None = None) -> RunResult:
  """Trains `cfg` in `workdir`, resuming from its latest readable checkpoint if it has one.

  on_step(step) is called after every completed step (tests use it to simulate crashes). Training only: the
  end-of-run Hugging Face export (export.hf_dir, through convert/) and the report that reads it are the job's,
  neobert_jax/pretrain.py, which the train command runs.
  """
  config_lib.validate(cfg)
  cfg = config_lib.resolve(cfg)
  workdir = paths.resolve(workdir, '--workdir')
  # Before the data is opened or a file written: a workdir holding another run is refused here, untouched.
  plan = resume_lib.check(cfg, workdir)
  if plan.step is None:
    init_lib.check_source(cfg)
  is_main = jax.process_index() == 0
  mesh = shd.make_mesh(dict(cfg.mesh))
  seq_len = int(cfg.model.max_length)
  # The data pipeline checks the prepared data's tokenizer against model.vocab_size here, before the model exists.
  train_host = pipeline.make_train_iterator(
      cfg.data, batches_lib.local_batch_size(cfg), seq_len, int(cfg.seed), jax.process_index(),
      jax.process_count(), model_vocab_size=int(cfg.model.vocab_size))
  if is_main:
    log.info('run: %s', config_lib.describe(cfg))

  defs, abstract = state_lib.abstract_train_state(cfg, mesh)
  mngr = ckpt.make_manager(workdir, int(cfg.checkpoint.keep), bool(cfg.checkpoint.async_save))
  restored = ckpt.restore_latest(mngr, abstract, train_host)
  if restored is not None:
    start, state = restored
    if is_main:
      log.info('resumed from %s/%d', mngr.directory, start)
  else:
    start = 0
    defs, state = state_lib.create_train_state(cfg, mesh)
    state = init_lib.maybe_initialise(cfg, defs, state)
  resume_lib.record(plan, cfg, start)  # config.json and the history line, once the state is in hand
  if is_main:
    log.info('%s parameters, sharded over %s', f'{state_lib.param_count(state):,}', dict(mesh.shape))

  train_step = step_lib.build_train_step(cfg, mesh, defs)
  eval_step = step_lib.build_eval_step(cfg, mesh, defs)
  data = batches_lib.GlobalBatches(train_host, cfg, mesh, int(cfg.train.grad_accum_steps))
  writer = metrics_lib.MetricsWriter(workdir, bool(cfg.logging.tensorboard))
  pbar = None
  if is_main and cfg.logging.progress_bar:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    pbar = tqdm(total=int(cfg.train.num_steps), initial=start, desc='train', unit='step', dynamic_ncols=True)
  logger = _Logger(cfg, writer, pbar)
  if is_main:
    log.info('MFU peak: %s FLOP/s (%s); %.3g model FLOPs per token', logger.peak, logger.peak_source, logger.fpt)
  result = RunResult(workdir=workdir, final_step=start)

  def last_good() -> str:
    ckpt.finish(mngr)
    s = mngr.latest_step()
    return f'{mngr.directory}/{s}' if s is not None else 'none (no checkpoint was written yet)'

  def do_eval(step: int) -> None:
    ev = _evaluate(cfg, mesh, eval_step, state['params'])
    writer.write(step, ev, prefix='eval')
    result.evals.append({'step': step, **ev})
    if is_main:
      (pbar.write if pbar is not None else log.info)(
          f'eval step {step}: loss {ev["loss"]:.4f}, accuracy {ev["accuracy"]:.4f}')

  num_steps, log_every = int(cfg.train.num_steps), int(cfg.logging.log_every)
  eval_every, ckpt_every = int(cfg.eval.every_steps), int(cfg.checkpoint.every_steps)
  prof_start, prof_n = int(cfg.logging.profile_start_step), int(cfg.logging.profile_num_steps)
  saved_at = start if restored is not None else -1
  try:
    with _Preemption(mngr, log_every) as preempt:
      if start == 0 and cfg.eval.at_start and eval_every > 0:
        do_eval(0)
      for step in range(start, num_steps):
        if step == prof_start:
          jax.profiler.start_trace(str(_profile_dir(workdir, writer)))
        batch, tokens = next(data)
        state, metrics = train_step(state, batch)
        done = step + 1
        logger.add(done, metrics, tokens)
        if step == prof_start + prof_n - 1 and prof_start >= 0:
          jax.block_until_ready(state)
          jax.profiler.stop_trace()
        if step == start:  # first step compiled: start the throughput clock from here
          jax.block_until_ready(metrics)
          logger.restart_clock()
        if pbar is not None:
          pbar.update(1)
        if done % log_every == 0 or done == num_steps:
          logger.flush(last_good)
        if eval_every > 0 and (done % eval_every == 0 or done == num_steps):
          logger.flush(last_good)
          do_eval(done)
          logger.restart_clock()
        stop = preempt.should_stop(done)
        if done % ckpt_every == 0 or done == num_steps or stop:
          logger.flush(last_good)  # never checkpoint parameters that went non-finite
          ckpt.save(mngr, done, state, train_host, cfg)
          writer.sync()  # a bucket workdir's metrics and TensorBoard go up with each checkpoint
          saved_at = done
        result.final_step = done
        if on_step is not None:
          on_step(done)
        if stop:
          result.preempted = True
          if is_main:
            log.warning('SIGTERM: saved checkpoint %s/%d, exiting', mngr.directory, done)
          break
    if result.final_step != saved_at and result.final_step > 0:
      ckpt.save(mngr, result.final_step, state, train_host, cfg)
    ckpt.finish(mngr)
  finally:
    if pbar is not None:
      pbar.close()
    writer.close()
    ckpt.close(mngr)
    if hasattr(train_host, 'close'):
      train_host.close()
  result.last_train = logger.last
  result.skipped_steps = logger.skipped
  return result
