"""The pretraining run's wiring on engine/: its config and resume plan, its data, and engine/trainer.Trainer with
the evaluation hooks (HeldOut below, train/probe.py); the job around it is jobs/pretrain.py."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import ml_collections

from neobert_jax import lease as lease_lib
from neobert_jax import paths
from neobert_jax import config as config_lib
from neobert_jax import sharding as shd
from neobert_jax.config import ramp
from neobert_jax.config import train as train_config
from neobert_jax.config.data import mask_rate_at
from neobert_jax.data import mixture as mixture_lib
from neobert_jax.data import pipeline
from neobert_jax.engine import metrics as metrics_lib
from neobert_jax.engine import session as session_lib
from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.engine.state import param_count
from neobert_jax.errors import DataError
from neobert_jax.train import mlm
from neobert_jax.train import probe as probe_lib
from neobert_jax.train import resume as resume_lib
from neobert_jax.weights import runs

log = logging.getLogger('neobert_jax.train')


@dataclasses.dataclass
class RunResult:
  workdir: Path
  config: ml_collections.FrozenConfigDict  # the resolved config the run trained with (its config.json)
  final_step: int
  preempted: bool = False
  evals: list[dict[str, float]] = dataclasses.field(default_factory=list)  # {'step', 'loss', 'accuracy', ...}
  skipped_steps: int = 0
  sources: pipeline.Sources | None = None  # the data it trained on, as opened (the report reads its held-out split)
  report: dict[str, Any] = dataclasses.field(default_factory=dict)


def plan_run(
  cfg: ml_collections.ConfigDict, workdir: paths.Path
) -> tuple[ml_collections.FrozenConfigDict, Any, pipeline.Sources]:
  """The run's config (resolved, frozen), its resume plan and its data, checked before opening."""
  cfg = train_config.validate_train(cfg)
  seq = cfg.model.max_length
  mix = pipeline.read_mixture(cfg.data, seq) if cfg.data.mixture else None
  # What is known before the data is opened: the run-time choices and the mixture's weights, for the resume check.
  known, choice = train_config.resolve_train(cfg, train_config.DataFacts(mixture=mix.record() if mix else ''))
  if jax.process_index() == 0:
    log.info('attention kernel: %s', choice.describe())
    if choice.warning:
      log.warning('attention: %s', choice.warning)
  plan = resume_lib.check_resume(known, workdir)
  recorded = plan.recorded['data'] if plan.step is not None and plan.recorded is not None else {}
  if plan.step is None:  # a new run: its source is opened here for its one-line errors (restore_or_init uses it)
    src = mlm.init_source(known)
    plan.origin = resume_lib.check_stage(known, src)
    recorded = resume_lib.stream(known, src)
  # The one place a run may tokenize: the built-in corpus, with the tokenizer set, else the one a resumed run recorded.
  data_cfg = config_lib.replace(cfg.data, {'tokenizer': cfg.data.tokenizer or recorded.get('tokenizer', '')})
  pipeline.prepare_builtin(data_cfg, seq)
  sources = pipeline.open_data(data_cfg, seq, mix=mix)
  facts = train_config.DataFacts(
    mixture=known.data.mixture_sources,
    tokenizer=sources.tokenizer(),
    block_docs=None
    if sources.mix.plain
    else lambda count, given: mixture_lib.format_block_docs(sources.block_docs(cfg.data.block_docs, given, count)),
  )
  cfg, _ = train_config.resolve_train(cfg, facts, recorded)
  return ml_collections.FrozenConfigDict(cfg), plan, sources


def _data(cfg: ml_collections.ConfigDict, sources: pipeline.Sources) -> tuple[Any, dict[str, Iterable[dict]]]:
  """(this process's train iterator, the held-out batches of one evaluation, per source)."""
  t, seq_len, nproc, pid = cfg.train, cfg.model.max_length, jax.process_count(), jax.process_index()
  common = dict(seed=cfg.seed, process_index=pid, process_count=nproc, model_vocab_size=cfg.model.vocab_size)
  reads = ramp.read_rows(cfg)
  train_host = pipeline.make_train_iterator(
    cfg.data,
    reads // nproc,  # this process's rows (config/train.validate_train checks that they split evenly)
    seq_len,
    prefetch=2 * (t.global_batch_size // reads),  # two full steps ahead, as without a ramp
    sources=sources,
    **common,
  )
  evaluating = cfg.eval.every_steps > 0
  data = train_config.eval_data_config(cfg)
  held = sources.with_eval()  # each source evaluated on its own held-out split (those that have one)
  # Opened even when evaluation is off: opening checks this host's held-out shards, which the report reads at the
  # end, so a damaged one is refused before the first file of the run is written, not after the whole run.
  local = t.global_batch_size // t.grad_accum_steps // nproc  # eval runs one micro-batch at a time
  held_out = {
    name: pipeline.make_eval_iterator(
      sources.config(data, name, share_cache=False), local, seq_len, num_batches=cfg.eval.num_batches, **common
    )
    for name in held
  }
  return train_host, held_out if evaluating else {}


def _source(keys: tuple[str, ...], mesh: Any, eval_step: Any, batches: Iterable[dict], params: Any) -> dict:
  sums = jax.device_get([eval_step(params, mlm.stitch_micro_batches(b, keys, mesh, 1)) for b in batches])
  n = max(sum(float(s['count']) for s in sums), 1.0)
  return {'loss': sum(float(s['loss_sum']) for s in sums) / n, 'accuracy': sum(float(s['correct']) for s in sums) / n}


class HeldOut:
  """hook(step, state, logger): held-out MLM figures of state[`item`] per source and weighted, in `records`."""

  def __init__(
    self,
    keys: tuple[str, ...],
    mesh: Any,
    eval_step: Any,
    batches: dict[str, Iterable[dict]],
    weights_at: Callable[[int], dict[str, float]] | None,
    item: str = 'params',
  ):
    self.keys, self.mesh, self.eval_step, self.batches, self.weights_at = keys, mesh, eval_step, batches, weights_at
    self.item, self.prefix = item, runs.eval_prefix(item)
    self.records: dict[int, dict[str, float]] = {}

  def evaluate(self, params: Any, step: int) -> dict[str, float]:
    per = {n: _source(self.keys, self.mesh, self.eval_step, b, params) for n, b in self.batches.items()}
    if self.weights_at is None:
      return next(iter(per.values()))
    weights = self.weights_at(step)
    total = sum(weights[n] for n in per) or 1.0
    out = {k: sum(weights[n] * m[k] for n, m in per.items()) / total for k in ('loss', 'accuracy')}
    return out | {f'{n}/{k}': v for n, m in per.items() for k, v in m.items()}

  def __call__(self, step: int, state: Any, logger: trainer_lib.Logger) -> None:
    ev = self.evaluate(state[self.item], step)
    self.records[step] = ev if self.item == 'params' else {f'{self.item}_{k}': v for k, v in ev.items()}
    who = 'eval' if self.item == 'params' else f'eval ({self.item})'
    logger.evaluated(step, ev, f'{who} step {step}: loss {ev["loss"]:.4f}, accuracy {ev["accuracy"]:.4f}', self.prefix)


def _wandb(cfg: ml_collections.ConfigDict) -> metrics_lib.Wandb | None:
  lg = cfg.logging
  if not lg.wandb:
    return None
  options = metrics_lib.Wandb.from_settings(
    lg.wandb_project, lg.wandb_run_name, lg.wandb_tags, lg.wandb_mode, cfg.to_dict()
  )
  metrics_lib.check_wandb(options)
  return options


def _counts(cfg: ml_collections.ConfigDict) -> Callable[[int], dict[str, float]]:
  """train/batch_size, train/tokens_seen (and train/mask_rate) of the logged step: exact host figures, from the ramp."""
  table, seq = ramp.phases(cfg), cfg.model.max_length
  falls = cfg.data.mask_rate_final > 0  # then train/mask_rate too, the rate of the logged step
  return lambda done: {
    'batch_size': float(ramp.phase_at(table, done - 1).size),
    'tokens_seen': float(ramp.tokens_through(table, seq, done)),
    **({'mask_rate': mask_rate_at(cfg.data, done - 1, cfg.train.num_steps)} if falls else {}),
  }


def _log_options(cfg: ml_collections.ConfigDict) -> trainer_lib.LogOptions:
  peak, peak_source = metrics_lib.total_peak_flops(cfg.logging.peak_flops_per_device, cfg.model.dtype)
  fpt = mlm.flops_per_token(cfg)
  if jax.process_index() == 0:
    log.info('MFU peak: %s FLOP/s (%s); %.3g model FLOPs per token', peak, peak_source, fpt)
  limit = mlm.max_segments(cfg.data)

  def check_rows(step: int, m: dict) -> None:
    if int(m.get('rows_over_document_limit', 0)):
      raise DataError(
        f'step {step}: {int(m["rows_over_document_limit"])} packed rows hold more documents than '
        f'data.max_documents_per_row={limit}, which the packed attention layout cannot represent. Data from '
        'this pipeline never does; raise --config.data.max_documents_per_row or pack your batches with that limit.'
      )

  return trainer_lib.LogOptions(
    nan_policy=cfg.train.nan_policy,
    flops_per_token=fpt,
    peak_flops=peak,
    check=None if limit is None else check_rows,
    check_keys=('rows_over_document_limit',),
    counts=_counts(cfg),
    diverged_hint='Re-running the same command resumes from it; consider a lower --config.optimizer.peak_lr, '
    'or --config.train.nan_policy=skip to drop such steps.',
  )


def _hooks(cfg: Any, mesh: Any, start: Any, sources: pipeline.Sources, eval_batches: dict) -> list[Any]:
  """The evaluation hooks, in order: the held-out MLM loss, the moving average's (train.ema_decay), the probe."""
  if cfg.eval.every_steps <= 0:
    return []
  keys, eval_step = mlm.batch_keys(cfg.data.max_predictions), mlm.jit_eval_step(cfg, mesh, start.defs)
  weights_at = None if sources.mix.plain else sources.mix.weights_at
  items = ('params', 'ema') if cfg.train.ema_decay > 0 else ('params',)
  hooks: list[Any] = [HeldOut(keys, mesh, eval_step, eval_batches, weights_at, i) for i in items]
  return hooks + ([probe_lib.ProbeHook(cfg, mesh, start)] if cfg.eval.probe_task else [])


def train(
  cfg: ml_collections.ConfigDict,
  workdir: paths.Path,
  lease: lease_lib.Lease | None,
  on_step: Callable[[int], None] | None = None,
) -> RunResult:
  """Trains `cfg` in `workdir` from its latest readable checkpoint if any, under the caller's `lease`."""
  _wandb(cfg)  # its one-line refusals (no package, no key, a bad mode) before any work
  cfg, plan, sources = plan_run(cfg, workdir)
  is_main = jax.process_index() == 0
  mesh = shd.make_mesh(dict(cfg.mesh))
  train_host, eval_batches = _data(cfg, sources)
  if is_main:
    log.info('run: %s; data tokenized with %s', train_config.describe_config(cfg), cfg.data.tokenizer)
  lg, t = cfg.logging, cfg.train
  with session_lib.TrainingSession(
    workdir,
    cfg,
    data_position=pipeline.Position(train_host, jax.process_index(), jax.process_count()),
    keep=cfg.checkpoint.keep,
    async_save=cfg.checkpoint.async_save,
    lease=lease,
    wandb=_wandb(cfg),  # the resolved config is what the wandb run records
  ) as session:
    if hasattr(train_host, 'close'):
      session.on_close(train_host.close)
    start = session.restore_or_init(
      lambda: mlm.abstract_train_state(cfg, mesh),
      lambda: mlm.create_train_state(cfg, mesh),
      source=lambda: mlm.init_source(cfg),
      keep_optimizer=cfg.init.keep_optimizer,
      continue_data=cfg.init.continue_data,
    )
    resume_lib.record(plan, cfg, start.step)  # config.json and the history line, once the state is in hand
    if is_main:
      log.info('%s parameters, sharded over %s', f'{param_count(start.state):,}', dict(mesh.shape))
    log_options = _log_options(cfg)  # measures the CPU's matmul peak: before the compile below loads the cores
    batches = mlm.GlobalBatches(train_host, cfg, mesh, start.step)
    step = mlm.jit_mlm_train_step(cfg, mesh, start.defs)
    ahead = trainer_lib.compile_ahead(step, start.state, batches.next_spec())  # beside the hooks' set-up and step 0
    hooks = _hooks(cfg, mesh, start, sources, eval_batches)
    options = trainer_lib.TrainerOptions(
      num_steps=t.num_steps,
      log_every=lg.log_every,
      hooks=tuple(trainer_lib.Hook(h, cfg.eval.every_steps) for h in hooks),
      checkpoint_every=cfg.checkpoint.every_steps,
      preemption=True,
      profile=(lg.profile_start_step, lg.profile_num_steps),
      on_step=on_step,
      log=log_options,
    )
    trainer = session.trainer(step, start, batches, options)
    if start.step == 0 and cfg.eval.at_start:
      for hook in hooks:
        hook(0, trainer.state, trainer.logger)
    ahead.join()
    trained = trainer.train()
    session.save_final(trained)
  # The evaluation hooks' records, one dict per evaluated step: {'step', 'loss', 'accuracy', ...}.
  steps = sorted({s for h in hooks for s in h.records})
  evals = [{'step': s, **{k: v for h in hooks for k, v in h.records.get(s, {}).items()}} for s in steps]
  return RunResult(
    workdir=workdir,
    config=cfg,
    final_step=trained.final_step,
    preempted=trained.preempted,
    evals=evals,
    skipped_steps=trained.skipped_steps,
    sources=sources,
  )
