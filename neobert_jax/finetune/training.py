"""What a fine-tuning run is made of, for every task: the checks before anything is written (prepare), the task's
jitted step, its batches and the evaluation hook that keeps the best step. The job is jobs/finetune.py; the files
it writes are listed in docs/downstream.md."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from neobert_jax import config as config_lib
from neobert_jax.config import finetune as finetune_config
from neobert_jax.config import resume as resume_rules
from neobert_jax.downstream import batching
from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.engine import session as session_lib
from neobert_jax.engine import step as engine_step
from neobert_jax.errors import ConfigError, DataError
from neobert_jax.weights import runs
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


def prepare_finetuning(cfg: ml_collections.ConfigDict, workdir: Path):
  """(the run's config, validated and resolved once and frozen (config/finetune.resolve_finetune: the architecture used,
  compute dtype, attention kernel, tokenizer, mesh); the weights' source; tokenizer; task): every check that needs
  no device work, nothing written."""
  cfg = finetune_config.validate_finetune(cfg)  # typed by the schema: nothing past here casts a config value
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
  resolved, choice = finetune_config.resolve_finetune(cfg, None if source is None else source.model_cfg, tok.spec)
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
    # The run recorded the rate it trained with (config/finetune.resolve_finetune): this config's, for the recorded width.
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


def batches(task: Any, mesh: Any):
  """Epoch after epoch of (global batch, real tokens, dropout key of that step), for engine/trainer.Trainer."""
  seed, step = task.cfg.seed, 0
  base_key, rng = jax.random.key(seed), np.random.default_rng(seed)
  while True:
    for batch in task.train_epoch(rng):
      tokens = int(sum(batch[k].sum() for k in batch if k.endswith('lengths')))
      batch = batching.shard_rows({k: batch[k] for k in task.batch_keys}, mesh)
      yield batch, tokens, jax.random.fold_in(base_key, step)
      step += 1


class Evaluations:
  """The evaluation hook: scores the validation split, keeps every result and saves the best step's parameters
  (a fine-tuning workdir keeps only its best evaluation, which its export reads)."""

  def __init__(self, session: session_lib.TrainingSession, task: Any, defs: Any, mesh: Any):
    self.session, self.task, self.mesh = session, task, mesh
    self.forward = batching.jit_forward(defs.model_def, defs.shardings['params'], mesh)
    self.best, self.final, self.evals = None, None, []

  def __call__(self, step: int, state: Any, logger: trainer_lib.Logger) -> None:
    task, size = self.task, self.task.cfg.train.eval_batch_size
    params = state['params']
    ev = task.evaluate(
      lambda seqs: batching.run_batched(self.forward, params, seqs, size, task.buckets, task.pad_id, self.mesh)
    )
    logger.evaluated(step, ev, f'eval step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in ev.items()))
    self.evals.append({'step': step, **ev})
    self.final = {'step': step, 'metrics': ev}
    if _better(task.metric, ev[task.metric], None if self.best is None else self.best['metrics'][task.metric]):
      self.best = self.final
      self.session.save_params(step, state)
