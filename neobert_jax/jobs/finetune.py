"""The fine-tuning job (`python -m neobert_jax.finetune`) and its GLUE grid sweep: lease, checks before anything is
written, training that keeps the best evaluated step, results and export (the files: docs/downstream.md)."""

from __future__ import annotations

import itertools
import json
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx

from neobert_jax import config as config_lib
from neobert_jax import errors, paths
from neobert_jax import sharding as shd
from neobert_jax.config import finetune as finetune_config
from neobert_jax.config import resume as resume_rules
from neobert_jax.config import train as train_config
from neobert_jax.downstream import batching
from neobert_jax.engine import optimizer as optimizer_lib
from neobert_jax.engine import session as session_lib
from neobert_jax.engine import step as engine_step
from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.engine.state import abstract_state, create_state, param_count
from neobert_jax.errors import ConfigError, DataError
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import runs
from neobert_jax.weights import source as source_lib

log = logging.getLogger('neobert_jax.finetune')
RESULTS_FILE = 'results.json'
LOWER_IS_BETTER = ('mse', 'loss')
GRID = {'lr': (5e-6, 6e-6, 1e-5, 2e-5, 3e-5), 'batch': (4, 8, 16, 32), 'weight_decay': (1e-2, 1e-5)}
SUMMARY_FILE = 'sweep.json'


def prepare_finetuning(cfg: ml_collections.ConfigDict, workdir: Path):
  """(config resolved and frozen, weights' source, tokenizer, task): every check before device work."""
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
        *(resolved.optimizer.lr, cfg.optimizer.lr, cfg.optimizer.lr_width, resolved.model.hidden_size),
      )
  from neobert_jax.finetune import classification, retrieval  # pylint: disable=g-import-not-at-top

  task = retrieval.ContrastiveTask if resolved.task == 'contrastive' else classification.ClassificationTask
  return resolved, source, tok, task(resolved, tok)


def _existing_run(cfg: ml_collections.ConfigDict, workdir: Path) -> str:
  """The refusal for a workdir that holds a fine-tuning run (never continued), naming what this config changes in it."""
  changed = ''
  if (workdir / runs.CONFIG_FILE).is_file():
    # model and mesh are recorded resolved (the source's architecture, the device count's mesh): not comparable.
    record = runs.read_config(workdir).to_dict()
    # The run recorded the rate it trained with (config/finetune.resolve_finetune): this config's, for the recorded width.
    width = record.get('model', {}).get('hidden_size', cfg.model.hidden_size)
    lr = {'lr': finetune_config.effective_lr(cfg.optimizer, width), 'lr_width': 0}
    current = config_lib.replace(cfg, {f'optimizer.{f}': v for f, v in lr.items()}).to_dict()
    past, current = ({k: v for k, v in d.items() if k not in ('model', 'mesh')} for d in (record, current))
    for d in (past, current):
      d.get('data', {}).pop('tokenizer', None)
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


def jit_step(defs: Any, mesh: Any, loss: Any, keys: list[str]) -> Any:
  """The jitted (state, batch, dropout key) -> (state, metrics) of a task, on whole batches."""
  data = batching.row_sharding(mesh)
  return engine_step.jit_train_step(
    defs,
    mesh,
    lambda model, batch, key: (loss(model, batch, key)[0], 1.0, {}),  # the batch-mean loss, counted once
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
  """The evaluation hook: scores the validation split and saves the best step's parameters."""

  def __init__(self, session: session_lib.TrainingSession, task: Any, defs: Any, mesh: Any):
    self.session, self.task, self.mesh = session, task, mesh
    self.forward = batching.jit_forward(defs.model_def, defs.shardings['params'], mesh)
    self.best, self.final, self.evals = None, None, []

  def __call__(self, step: int, state: Any, logger: trainer_lib.Logger) -> None:
    task, size, params = self.task, self.task.cfg.train.eval_batch_size, state['params']
    ev = task.evaluate(
      lambda seqs: batching.run_batched(self.forward, params, seqs, size, task.buckets, task.pad_id, self.mesh)
    )
    logger.evaluated(step, ev, f'eval step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in ev.items()))
    self.evals.append({'step': step, **ev})
    self.final = {'step': step, 'metrics': ev}
    new, best = ev[task.metric], None if self.best is None else self.best['metrics'][task.metric]
    if best is None or (new < best if task.metric in LOWER_IS_BETTER else new > best):
      self.best = self.final
      self.session.save_params(step, state)


def finetune(cfg: ml_collections.ConfigDict, workdir: str | Path) -> dict[str, Any]:
  """Fine-tunes per cfg in workdir under its lease, taken first; returns the results, also in WORKDIR/results.json."""
  workdir = paths.resolve(workdir, '--workdir')  # the one resolution of the job's workdir
  with session_lib.claim(workdir, cfg.run_id) as lease:
    return _run(cfg, workdir, lease)


def _run(cfg: ml_collections.ConfigDict, workdir: Path, lease: Any) -> dict[str, Any]:
  cfg, source, tok, task = prepare_finetuning(cfg, workdir)
  is_main = jax.process_index() == 0
  train_config.write_config(cfg, workdir)
  runs.save_tokenizer(workdir, tok.path)  # the run carries its vocabulary: embed / export work from a copy of it
  if is_main and hasattr(task, 'save'):
    task.save(workdir)
  mesh = shd.make_mesh(dict(cfg.mesh))
  t, m = cfg.train, cfg.model
  steps_per_epoch = task.steps_per_epoch()
  num_steps = t.num_steps if t.num_steps > 0 else t.epochs * steps_per_epoch
  tx, lr = optimizer_lib.make_finetune_optimizer(cfg.optimizer, num_steps)
  factory = lambda: task.make_model(m, nnx.Rngs(cfg.seed))  # noqa: E731
  with session_lib.TrainingSession(workdir, cfg, keep=1, async_save=False, lease=lease) as session:
    start = session.restore_or_init(
      lambda: abstract_state(factory, tx, lr, mesh),
      lambda: create_state(factory, tx, lr, mesh),
      resume=False,  # a fine-tuning workdir is never continued (prepare refused one that holds a run)
      source=lambda: source,
      place=lambda src, params: flat_lib.with_encoder(params, src.flat),
    )
    if is_main:
      log.info(
        '%s; %d layers x %d, %s parameters, %d steps (%d per epoch), mesh %s',
        *(task.describe(), m.num_layers, m.hidden_size, f'{param_count(start.state):,}', num_steps, steps_per_epoch),
        dict(mesh.shape),
      )
    evaluations = Evaluations(session, task, start.defs, mesh)
    options = trainer_lib.TrainerOptions(
      num_steps=num_steps,
      log_every=t.log_every,
      hooks=(trainer_lib.Hook(evaluations, t.eval_every or steps_per_epoch),),
      last_good=lambda: 'none (fine-tuning keeps only its best evaluation)',
      desc=f'finetune {task.kind}',
      log=trainer_lib.LogOptions(nan_policy='stop', diverged_hint='Lower --config.optimizer.lr.'),
    )
    step = jit_step(start.defs, mesh, task.loss, task.batch_keys)
    trained = session.trainer(step, start, batches(task, mesh), options).train()
  results = {
    'task': cfg.task,
    'kind': task.kind,
    'metric': task.metric,
    'final': evaluations.final,
    'best': evaluations.best,
    'num_steps': num_steps,
    'train_examples': task.num_train,
    'train_tokens_per_sec': float(np.median(trained.throughput)) if trained.throughput else None,
    'evals': evaluations.evals,
  }
  if not is_main:
    return results
  paths.write_text(workdir / RESULTS_FILE, json.dumps(results, indent=2) + '\n')
  if cfg.export.dir:
    from neobert_jax.finetune import export as export_lib  # pylint: disable=g-import-not-at-top

    results['export'] = str(export_lib.export_run(workdir, cfg.export.dir, overwrite=True))
  return results


def finetune_command(cfg: ml_collections.ConfigDict, workdir: str) -> int:
  """The finetune command: the job, its outcome printed; the exit status (3: diverged; an expected error's own)."""
  try:
    with errors.reported('finetune', errors.take_debug_flag([])):
      results = finetune(cfg, workdir)
  except SystemExit as e:  # the expected error, already reported
    return e.code
  except FloatingPointError as e:
    print(f'finetune: stopped: {e}', file=sys.stderr)
    return 3
  best, final, metric = results['best'], results['final'], results['metric']
  print(
    f'finished {results["num_steps"]} steps; best {metric} {best["metrics"][metric]:.4f} at step '
    f'{best["step"]}, final {final["metrics"][metric]:.4f}; results {workdir}/results.json'
    + (f'; exported {results["export"]}' if 'export' in results else '')
  )
  return 0


def point_name(lr: float, batch: int, wd: float) -> str:
  return f'lr{lr:g}_bs{batch}_wd{wd:g}'


def run_sweep(
  cfg: ml_collections.ConfigDict,
  workdir: str | Path,
  lrs: Sequence[float],
  batches: Sequence[int],
  weight_decays: Sequence[float],
) -> dict[str, Any]:
  """Runs (or reads back) every point; returns {'metric', 'rows': [...], 'best': row}."""
  root = paths.resolve(workdir, '--workdir')  # each point's job resolves its own workdir
  rows = []
  for lr, batch, wd in itertools.product(lrs, batches, weight_decays):
    point = root / point_name(lr, batch, wd)
    results_path = point / RESULTS_FILE
    reused = results_path.exists()
    if not reused:
      if point.exists():  # an interrupted point of this sweep: its partial files belong to us, start it again
        point.rmtree()
      point_fields = {'optimizer.lr': float(lr), 'train.batch_size': int(batch), 'optimizer.weight_decay': float(wd)}
      finetune(config_lib.replace(cfg, {**point_fields, 'export.dir': ''}), point)
    results = json.loads(results_path.read_text())
    metric = results['metric']
    rows.append(
      {
        'lr': lr,
        'batch': batch,
        'weight_decay': wd,
        'metric': metric,
        'best': results['best']['metrics'][metric],
        'best_step': results['best']['step'],
        'final': results['final']['metrics'][metric],
        'workdir': str(point),
        'reused': reused,
      }
    )
  best = (min if rows[0]['metric'] in LOWER_IS_BETTER else max)(rows, key=lambda r: r['best'])
  summary = {'metric': rows[0]['metric'], 'rows': rows, 'best': best}
  paths.write_text(root / SUMMARY_FILE, json.dumps(summary, indent=2) + '\n')
  return summary


def format_sweep_table(summary: dict[str, Any]) -> str:
  m = summary['metric']
  lines = [f'{"lr":>8} {"batch":>5} {"wd":>7} {"best " + m:>18} {"step":>6} {"final":>8}']
  for r in summary['rows']:
    mark = ' *' if r == summary['best'] else ''
    lines.append(
      f'{r["lr"]:>8g} {r["batch"]:>5} {r["weight_decay"]:>7g} {r["best"]:>18.4f} {r["best_step"]:>6} '
      f'{r["final"]:>8.4f}{mark}'
    )
  b = summary['best']
  lines.append(
    f'best: lr {b["lr"]:g}, batch {b["batch"]}, weight decay {b["weight_decay"]:g}: {m} {b["best"]:.4f} '
    f'at step {b["best_step"]} ({b["workdir"]})'
  )
  return '\n'.join(lines)
