"""The fine-tuning job shared by every task: take the workdir's lease, prepare (all checks first), train, evaluate,
keep the best, report.

Order matters for bad input: the config, the weights' source, the tokenizer and the data files are all checked
before the first file is written, so a mistake costs one error line and leaves the workdir as it was.

Workdir layout:
  config.json       the resolved config (model = the architecture actually used, data.tokenizer resolved)
  labels.json       the label mapping (classification / regression)
  checkpoints/<s>/  Orbax params of the best validation step s (weights/runs.restore_params reads it)
  metrics.jsonl, tensorboard/   train/* every log_every steps, eval/* at every evaluation
  results.json      final and best validation metrics with their steps
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from neobert_jax import config as config_lib
from neobert_jax import paths
from neobert_jax import sharding as shd
from neobert_jax.config import finetune as finetune_config
from neobert_jax.config import resume as resume_rules
from neobert_jax.config import train as train_config
from neobert_jax.downstream import batching, inference
from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.engine import optimizer as optimizer_lib
from neobert_jax.engine import session as session_lib
from neobert_jax.engine import step as engine_step
from neobert_jax.engine.state import abstract_state, create_state, param_count
from neobert_jax.errors import ConfigError, DataError
from neobert_jax.weights import place, runs
from neobert_jax.weights import source as source_lib

log = logging.getLogger('neobert_jax.finetune')
RESULTS_FILE = 'results.json'
LOWER_IS_BETTER = ('mse', 'loss')


def make_task(cfg: ml_collections.ConfigDict, tok: Any):
  if cfg.task == 'contrastive':
    from neobert_jax.finetune.retrieval import ContrastiveTask  # pylint: disable=g-import-not-at-top

    return ContrastiveTask(cfg, tok)
  from neobert_jax.finetune.classification import ClassificationTask  # pylint: disable=g-import-not-at-top

  return ClassificationTask(cfg, tok)


def prepare(cfg: ml_collections.ConfigDict, workdir: Path):
  """(the run's config, validated and resolved once and frozen (config/finetune.resolve: the architecture used,
  compute dtype, attention kernel, tokenizer, mesh); the weights' source; tokenizer; task): every check that needs
  no device work, nothing written."""
  cfg = finetune_config.validate(cfg)  # typed by the schema: nothing past here casts a config value
  session_lib.check_workdir(workdir)
  if (workdir / RESULTS_FILE).exists() or (workdir / runs.CHECKPOINT_SUBDIR).exists():
    raise ConfigError(_existing_run(cfg, workdir))
  init = cfg.init
  source = source_lib.from_init(init.from_checkpoint, init.from_hf, init.step)
  if source is not None:
    source.read()
  tok = source_lib.resolve_tokenizer(cfg.data.tokenizer, source)
  if source is None and tok.vocab_size > cfg.model.vocab_size:
    raise DataError(
      f'tokenizer {tok.spec!r} has {tok.vocab_size} tokens but model.vocab_size={cfg.model.vocab_size}; '
      'set --config.model.vocab_size or start from a pretrained model (init.*)'
    )
  resolved, choice = finetune_config.resolve(cfg, None if source is None else source.model_cfg, tok.spec)
  if jax.process_index() == 0:
    log.info('attention kernel: %s', choice.describe())
    if resolved.optimizer.lr != cfg.optimizer.lr:
      log.info(
        'learning rate %.3g: optimizer.lr %.3g is quoted for width %d (optimizer.lr_width), this model is %d '
        'wide; set optimizer.lr_width=0 to use optimizer.lr as given',
        resolved.optimizer.lr,
        cfg.optimizer.lr,
        cfg.optimizer.lr_width,
        resolved.model.hidden_size,
      )
  return resolved, source, tok, make_task(resolved, tok)


def _existing_run(cfg: ml_collections.ConfigDict, workdir: Path) -> str:
  """The refusal for a workdir that already holds a fine-tuning run (it is never continued nor overwritten),
  naming the fields this config changes against the one recorded there."""
  changed = ''
  if (workdir / runs.CONFIG_FILE).is_file():
    # model and mesh are recorded resolved (the source's architecture, the device count's mesh): not comparable.
    record = runs.read_config(workdir).to_dict()
    # The run recorded the rate it trained with (config/finetune.resolve): this config's, for the recorded width.
    width = record.get('model', {}).get('hidden_size', cfg.model.hidden_size)
    lr = {'lr': finetune_config.effective_lr(cfg.optimizer, width), 'lr_width': 0}
    current = config_lib.replace(cfg, {f'optimizer.{f}': v for f, v in lr.items()}).to_dict()
    current = {k: v for k, v in current.items() if k not in ('model', 'mesh')}
    past = {k: v for k, v in record.items() if k not in ('model', 'mesh')}
    past.get('data', {}).pop('tokenizer', None)
    current.get('data', {}).pop('tokenizer', None)
    changes = resume_rules.diff(past, current, {})
    changed = (
      f' (this config differs from it in: {"; ".join(c.describe() for c in changes)})'
      if changes
      else ' (with this same config; its results are in results.json)'
    )
  return (
    f'{workdir} already holds a fine-tuning run{changed}; nothing in it was changed. Choose a new --workdir, '
    'or delete that one to redo it'
  )


def _better(metric: str, new: float, old: float | None) -> bool:
  return old is None or (new < old if metric in LOWER_IS_BETTER else new > old)


def _loss_sums(loss: Any) -> Any:
  """A task's batch-mean loss as the engine's summed loss: one micro-batch, counted once."""

  def loss_sums(model: Any, batch: dict, key: Any):
    value, _ = loss(model, batch, key)
    return value, 1.0, {}

  return loss_sums


def jit_step(defs: Any, mesh: Any, loss: Any, keys: list[str]) -> Any:
  """The jitted (state, batch, dropout key) -> (state, metrics) of a task: the engine's step on whole batches
  (rows split over data x fsdp), committing nothing non-finite unseen (the loop stops at its next flush)."""
  data = batching.row_sharding(mesh)
  return engine_step.jit_train_step(
    defs,
    mesh,
    _loss_sums(loss),
    {k: data for k in keys},
    engine_step.StepOptions(micro_batched=False, skip_nonfinite=False),
    uses_key=True,
  )


def _batches(task: Any, keys: list[str], mesh: Any, seed: int):
  """Epoch after epoch of (global batch, real tokens, dropout key of that step), for engine/trainer.Trainer."""
  base_key, rng, step = jax.random.key(seed), np.random.default_rng(seed), 0
  while True:
    for batch in task.train_epoch(rng):
      tokens = int(sum(batch[k].sum() for k in batch if k.endswith('lengths')))
      yield batching.shard_rows({k: batch[k] for k in keys}, mesh), tokens, jax.random.fold_in(base_key, step)
      step += 1


class _Evaluations:
  """The evaluation hook: scores the validation split, keeps every result and saves the best step's parameters
  (a fine-tuning workdir keeps only its best evaluation, which its export reads)."""

  def __init__(
    self, session: session_lib.TrainingSession, task: Any, forward: Any, batch_size: int, pad_id: int, mesh: Any
  ):
    self.session, self.task, self.mesh = session, task, mesh
    self.forward, self.batch_size, self.pad_id = forward, batch_size, pad_id
    self.best, self.final, self.evals = None, None, []

  def __call__(self, step: int, state: Any, logger: trainer_lib.Logger) -> None:
    task = self.task
    ev = task.evaluate(
      lambda seqs: inference.run_batched(
        self.forward, state['params'], seqs, self.batch_size, task.buckets, self.pad_id, self.mesh
      )
    )
    self.session.writer.write(step, ev, prefix='eval')
    self.evals.append({'step': step, **ev})
    self.final = {'step': step, 'metrics': ev}
    if _better(task.metric, ev[task.metric], None if self.best is None else self.best['metrics'][task.metric]):
      self.best = self.final
      self.session.save_params(step, state)
    if self.session.is_main:
      logger.say(f'eval step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in ev.items()))


def finetune(cfg: ml_collections.ConfigDict, workdir: str | Path) -> dict[str, Any]:
  """Fine-tunes per cfg in workdir under the workdir's lease (taken here, before anything there is read or
  written); returns the results dict also written to WORKDIR/results.json."""
  workdir = paths.resolve(workdir, '--workdir')
  with session_lib.claim(workdir, cfg.run_id) as lease:
    return _finetune(cfg, workdir, lease)


def _finetune(cfg: ml_collections.ConfigDict, workdir: Path, lease: Any) -> dict[str, Any]:
  cfg, source, tok, task = prepare(cfg, workdir)
  is_main = jax.process_index() == 0
  train_config.write(cfg, workdir)
  runs.save_tokenizer(workdir, tok.path)  # the run carries its vocabulary: embed / export work from a copy of it
  if is_main and hasattr(task, 'save'):
    task.save(workdir)
  mesh = shd.make_mesh(dict(cfg.mesh))
  t, m, lg = cfg.train, cfg.model, cfg.logging
  steps_per_epoch = task.steps_per_epoch()
  num_steps = t.num_steps if t.num_steps > 0 else t.epochs * steps_per_epoch
  tx, lr = optimizer_lib.make_finetune_optimizer(cfg.optimizer, num_steps)
  factory = lambda: task.make_model(m, nnx.Rngs(cfg.seed))  # noqa: E731
  with session_lib.TrainingSession(
    workdir, cfg, keep=1, async_save=False, tensorboard=lg.tensorboard, progress_bar=lg.progress_bar, lease=lease
  ) as session:
    start = session.restore_or_init(
      lambda: abstract_state(factory, tx, lr, mesh),
      lambda: create_state(factory, tx, lr, mesh),
      resume=False,  # a fine-tuning workdir is never continued (prepare refused one that holds a run)
      source=lambda: source,
      place=lambda src, params: place.with_encoder(params, src.flat),
    )
    if is_main:
      log.info(
        '%s; %d layers x %d, %s parameters, %d steps (%d per epoch), mesh %s',
        *(task.describe(), m.num_layers, m.hidden_size, f'{param_count(start.state):,}', num_steps, steps_per_epoch),
        dict(mesh.shape),
      )
    forward = inference.jit_forward(start.defs.model_def, start.defs.shardings['params'], mesh)
    evaluations = _Evaluations(session, task, forward, t.eval_batch_size, tok.pad_id, mesh)
    options = trainer_lib.TrainerOptions(
      num_steps=num_steps,
      log_every=t.log_every,
      hooks=(trainer_lib.Hook(evaluations, t.eval_every or steps_per_epoch),),
      last_good=lambda: 'none (fine-tuning keeps only its best evaluation)',
      desc=f'finetune {task.kind}',
      log=trainer_lib.LogOptions(nan_policy='stop', diverged_hint='Lower --config.optimizer.lr.'),
    )
    step = jit_step(start.defs, mesh, task.loss, task.batch_keys)
    trained = session.trainer(step, start, _batches(task, task.batch_keys, mesh, cfg.seed), options).train()
  return _finish(cfg, workdir, task, num_steps, evaluations, trained.throughput)


def _finish(
  cfg: ml_collections.ConfigDict, workdir: Path, task: Any, num_steps: int, ev: _Evaluations, throughput: list
) -> dict[str, Any]:
  """WORKDIR/results.json, and the export of the best step when export.dir is set."""
  results = {
    'task': cfg.task,
    'kind': task.kind,
    'metric': task.metric,
    'final': ev.final,
    'best': ev.best,
    'num_steps': num_steps,
    'train_examples': task.num_train,
    'train_tokens_per_sec': float(np.median(throughput)) if throughput else None,
    'evals': ev.evals,
  }
  if jax.process_index() != 0:
    return results
  paths.write_text(workdir / RESULTS_FILE, json.dumps(results, indent=2) + '\n')
  if cfg.export.dir:
    from neobert_jax.finetune import export as export_lib  # pylint: disable=g-import-not-at-top

    results['export'] = str(export_lib.export_run(workdir, cfg.export.dir, overwrite=True))
  return results
