"""Pretraining on the engine: resume or initialise, then engine.loop.Trainer with an evaluation and a checkpoint hook.

What is pretraining's own: the resume plan (train/resume.py), the data iterator whose position is checkpointed
with the state, the MLM evaluation on the held-out split, and the RunResult the train command reports.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import ml_collections

from neobert_jax import paths
from neobert_jax import sharding as shd
from neobert_jax.data.pipeline import iterators as pipeline
from neobert_jax.engine import checkpoint as ckpt
from neobert_jax.engine import loop as engine_loop
from neobert_jax.engine import metrics as metrics_lib
from neobert_jax.engine.preemption import Preemption
from neobert_jax.engine.state import param_count
from neobert_jax.errors import DataError
from neobert_jax.train import batches as batches_lib
from neobert_jax.config import train as config_lib
from neobert_jax.train import init as init_lib
from neobert_jax.train import mlm
from neobert_jax.train import resume as resume_lib
from neobert_jax.train import runtime

log = logging.getLogger('neobert_jax.train')


@dataclasses.dataclass
class RunResult:
  workdir: Path
  final_step: int
  preempted: bool = False
  evals: list[dict[str, float]] = dataclasses.field(default_factory=list)  # {'step', 'loss', 'accuracy'}
  last_train: dict[str, float] = dataclasses.field(default_factory=dict)
  skipped_steps: int = 0
  # train/report.py's unigram baseline and fill-mask examples, filled in by neobert_jax/pretrain.py after the export
  report: dict[str, Any] = dataclasses.field(default_factory=dict)


def _evaluate(
  keys: tuple[str, ...], mesh: jax.sharding.Mesh, eval_step: Any, eval_batches: Iterable[dict], params: Any
) -> dict[str, float]:
  sums = []
  for b in eval_batches:
    sums.append(eval_step(params, batches_lib.to_global(b, keys, mesh, 1)))
  total = jax.device_get(sums)
  count = max(sum(float(s['count']) for s in total), 1.0)
  return {
    'loss': sum(float(s['loss_sum']) for s in total) / count,
    'accuracy': sum(float(s['correct']) for s in total) / count,
  }


def _check_rows(limit: int) -> Callable[[int, dict], None]:
  def check(step: int, m: dict) -> None:
    if int(m.get('rows_over_document_limit', 0)):
      raise DataError(
        f'step {step}: {int(m["rows_over_document_limit"])} packed rows hold more documents than '
        f'data.max_documents_per_row={limit}, which the packed attention layout cannot represent. Data from '
        'this pipeline never does; raise --config.data.max_documents_per_row or pack your batches with that '
        'limit.'
      )

  return check


def _profile_dir(workdir: paths.Path, writer: metrics_lib.MetricsWriter) -> Path:
  """WORKDIR/profile; for a bucket workdir, process 0 traces into the metrics mirror (uploaded with it) and the
  others into this machine's cache (the profiler writes local files)."""
  if paths.local(workdir):
    return Path(workdir) / 'profile'
  where = writer.local_dir or paths.cache_dir('profile', paths.url_key(workdir))
  log.info('profile trace of process %d: %s', jax.process_index(), where / 'profile')
  return where / 'profile'


def run(cfg: ml_collections.ConfigDict, workdir: str | Path, on_step: Callable[[int], None] | None = None) -> RunResult:
  """Trains `cfg` in `workdir`, resuming from its latest readable checkpoint if it has one.

  on_step(step) is called after every completed step (tests use it to simulate crashes). Training only: the
  end-of-run Hugging Face export (export.hf_dir, through convert/) and the report that reads it are the job's,
  neobert_jax/pretrain.py, which the train command runs.
  """
  cfg = runtime.resolve(config_lib.validate(cfg))
  workdir = paths.resolve(workdir, '--workdir')
  # Before the data is opened or a file written: a workdir holding another run is refused here, untouched.
  plan = resume_lib.check(cfg, workdir)
  if plan.step is None:
    init_lib.check_source(cfg)
  is_main = jax.process_index() == 0
  mesh = shd.make_mesh(dict(cfg.mesh))
  seq_len, vocab, t, nproc = cfg.model.max_length, cfg.model.vocab_size, cfg.train, jax.process_count()
  # The run's tokenizer is part of its config (config.json): an unset data.tokenizer continues with the recorded
  # one on a resume, else it is the prepared data's (config/resume.py: unset is no change).
  cfg.data.tokenizer = cfg.data.tokenizer or plan.recorded_tokenizer()
  pipeline.prepare_builtin(cfg.data, seq_len)  # the one place a run may tokenize: the built-in corpus, once
  cfg.data.tokenizer = cfg.data.tokenizer or pipeline.open_prepared(cfg.data, seq_len)[1]['tokenizer']['spec']
  # The data pipeline checks the prepared data's tokenizer against model.vocab_size here, before the model exists.
  train_host = pipeline.make_train_iterator(
    cfg.data,
    batches_lib.local_batch_size(t.global_batch_size, nproc),
    seq_len,
    cfg.seed,
    jax.process_index(),
    nproc,
    model_vocab_size=vocab,
  )
  eval_every = cfg.eval.every_steps
  eval_batches = (
    pipeline.make_eval_iterator(
      cfg.data,
      batches_lib.local_eval_batch_size(t.global_batch_size, t.grad_accum_steps, nproc),
      seq_len,
      seed=cfg.seed,
      process_index=jax.process_index(),
      process_count=nproc,
      num_batches=cfg.eval.num_batches,
      model_vocab_size=vocab,
    )
    if eval_every > 0
    else ()
  )
  if is_main:
    log.info('run: %s; data tokenized with %s', config_lib.describe(cfg), cfg.data.tokenizer)

  defs, abstract = mlm.abstract_train_state(cfg, mesh)
  mngr = ckpt.make_manager(workdir, cfg.checkpoint.keep, cfg.checkpoint.async_save)
  restored = ckpt.restore_latest(mngr, abstract, train_host)
  if restored is not None:
    start, state = restored
    if is_main:
      log.info('resumed from %s/%d', mngr.directory, start)
  else:
    start = 0
    defs, state = mlm.create_train_state(cfg, mesh)
    state = init_lib.maybe_initialise(cfg, defs, state)
  resume_lib.record(plan, cfg, start)  # config.json and the history line, once the state is in hand
  if is_main:
    log.info('%s parameters, sharded over %s', f'{param_count(state):,}', dict(mesh.shape))

  keys = mlm.batch_keys(cfg.data.max_predictions)
  eval_step = mlm.build_eval_step(cfg, mesh, defs)
  writer = metrics_lib.MetricsWriter(workdir, cfg.logging.tensorboard)
  pbar = None
  if is_main and cfg.logging.progress_bar:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

    pbar = tqdm(total=cfg.train.num_steps, initial=start, desc='train', unit='step', dynamic_ncols=True)
  peak, peak_source = metrics_lib.total_peak_flops(cfg.logging.peak_flops_per_device, cfg.model.dtype)
  fpt = metrics_lib.flops_per_token(cfg)
  limit = mlm.max_segments(cfg.data)
  logger = engine_loop.Logger(
    writer,
    pbar,
    nan_policy=cfg.train.nan_policy,
    flops_per_token=fpt,
    peak_flops=peak,
    check=None if limit is None else _check_rows(limit),
    check_keys=('rows_over_document_limit',),
    diverged_hint='Re-running the same command resumes from it; consider a lower --config.optimizer.peak_lr, '
    'or --config.train.nan_policy=skip to drop such steps.',
  )
  if is_main:
    log.info('MFU peak: %s FLOP/s (%s); %.3g model FLOPs per token', peak, peak_source, fpt)
  result = RunResult(workdir=workdir, final_step=start)
  saved = {'step': start if restored is not None else -1}

  def last_good() -> str:
    ckpt.finish(mngr)
    s = mngr.latest_step()
    return f'{mngr.directory}/{s}' if s is not None else 'none (no checkpoint was written yet)'

  def evaluate(step: int, state: Any) -> None:
    ev = _evaluate(keys, mesh, eval_step, eval_batches, state['params'])
    writer.write(step, ev, prefix='eval')
    result.evals.append({'step': step, **ev})
    if is_main:
      trainer.say(f'eval step {step}: loss {ev["loss"]:.4f}, accuracy {ev["accuracy"]:.4f}')

  def checkpoint(step: int, state: Any) -> None:
    ckpt.save(mngr, step, state, train_host, cfg)
    writer.sync()  # a bucket workdir's metrics and TensorBoard go up with each checkpoint
    saved['step'] = step

  profile = engine_loop.Profile(
    cfg.logging.profile_start_step, cfg.logging.profile_num_steps, lambda: _profile_dir(workdir, writer)
  )
  try:
    with Preemption(mngr, cfg.logging.log_every) as preempt:
      trainer = engine_loop.Trainer(
        mlm.build_train_step(cfg, mesh, defs),
        state,
        batches_lib.GlobalBatches(train_host, cfg.data.max_predictions, mesh, t.grad_accum_steps),
        num_steps=cfg.train.num_steps,
        start=start,
        logger=logger,
        log_every=cfg.logging.log_every,
        hooks=[
          engine_loop.Hook(evaluate, eval_every),
          engine_loop.Hook(checkpoint, cfg.checkpoint.every_steps, checkpoint=True),
        ],
        last_good=last_good,
        preemption=preempt,
        profile=profile,
        pbar=pbar,
        on_step=on_step,
      )
      if start == 0 and cfg.eval.at_start and eval_every > 0:
        evaluate(0, state)
      del state  # donated to the first step: the trainer holds the live state
      state = trainer.run()
    result.final_step, result.preempted = trainer.final_step, trainer.preempted
    if result.preempted and is_main:
      log.warning('SIGTERM: saved checkpoint %s/%d, exiting', mngr.directory, result.final_step)
    if result.final_step != saved['step'] and result.final_step > 0:
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
