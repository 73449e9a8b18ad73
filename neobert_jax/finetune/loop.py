"""The fine-tuning loop shared by every task: build (all checks first), train, evaluate, keep the best, report.

Order matters for bad input: the config, the weights' source, the tokenizer and the data files are all checked
before the first file is written, so a mistake costs one error line and leaves the workdir as it was.

Workdir layout:
  config.json       the resolved config (model = the architecture actually used, data.tokenizer resolved)
  labels.json       the label mapping (classification / regression)
  checkpoints/<s>/  Orbax params of the best validation step s (train/checkpoint.restore_params reads it)
  metrics.jsonl, tensorboard/   train/* every log_every steps, eval/* at every evaluation
  results.json      final and best validation metrics with their steps
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from neobert_jax import paths
from neobert_jax import sharding as shd
from neobert_jax.downstream import batching, inference
from neobert_jax.finetune import config as config_lib, source as source_lib, state as state_lib
from neobert_jax.finetune import step as step_lib
from neobert_jax.config import resume as resume_rules
from neobert_jax.errors import ConfigError
from neobert_jax.errors import DataError
from neobert_jax.model.config import resolve_dtype
from neobert_jax.train import checkpoint as ckpt
from neobert_jax.train import config as train_config
from neobert_jax.train import resume as resume_lib
from neobert_jax.train.metrics import MetricsWriter

log = logging.getLogger('neobert_jax.finetune')
RESULTS_FILE = 'results.json'
_RUNTIME_FIELDS = ('dtype', 'attention_impl', 'scan_layers', 'remat_policy', 'param_dtype')
_LOWER_IS_BETTER = ('mse', 'loss')


def make_task(cfg: ml_collections.ConfigDict, tok: Any):
  if cfg.task == 'contrastive':
    from neobert_jax.finetune.retrieval import ContrastiveTask  # pylint: disable=g-import-not-at-top
    return ContrastiveTask(cfg, tok)
  from neobert_jax.finetune.classification import ClassificationTask  # pylint: disable=g-import-not-at-top
  return ClassificationTask(cfg, tok)


def model_config(cfg: ml_collections.ConfigDict, source: source_lib.Source | None) -> ml_collections.ConfigDict:
  """The source's architecture (or cfg.model for a random init) with this run's numerics."""
  m = ml_collections.ConfigDict(cfg.model.to_dict())
  if source is not None:
    m = ml_collections.ConfigDict(source.model_cfg.to_dict())
    for field in _RUNTIME_FIELDS:
      m[field] = cfg.model[field]
  m.dtype = resolve_dtype(m.dtype)
  return m


def prepare(cfg: ml_collections.ConfigDict, workdir: Path):
  """(source, model config, tokenizer, task): every check that needs no device work, nothing written."""
  config_lib.validate(cfg)
  resume_lib.check_workdir(workdir)
  if (workdir / RESULTS_FILE).exists() or (workdir / ckpt.CHECKPOINT_SUBDIR).exists():
    raise ConfigError(_existing_run(cfg, workdir))
  init = cfg.init
  source = None
  if init.from_checkpoint or init.from_hf:
    step = None if init.step < 0 else int(init.step)
    source = source_lib.load(init.from_checkpoint or init.from_hf, step if init.from_checkpoint else None)
  tok = source_lib.resolve_tokenizer(cfg.data.tokenizer, source)
  m = model_config(cfg, source)
  if source is None and tok.vocab_size > m.vocab_size:
    raise DataError(f'tokenizer {tok.spec!r} has {tok.vocab_size} tokens but model.vocab_size={m.vocab_size}; '
                    'set --config.model.vocab_size or start from a pretrained model (init.*)')
  return source, m, tok, make_task(cfg, tok)


def _existing_run(cfg: ml_collections.ConfigDict, workdir: Path) -> str:
  """The refusal for a workdir that already holds a fine-tuning run (it is never continued nor overwritten),
  naming the fields this config changes against the one recorded there."""
  recorded = workdir / 'config.json'
  changed = ''
  if recorded.is_file():
    # model and mesh are recorded resolved (the source's architecture, the device count's mesh): not comparable.
    current = {k: v for k, v in cfg.to_dict().items() if k not in ('model', 'mesh')}
    past = {k: v for k, v in json.loads(recorded.read_text()).items() if k not in ('model', 'mesh')}
    past.get('data', {}).pop('tokenizer', None)
    current.get('data', {}).pop('tokenizer', None)
    changes = resume_rules.diff(past, current, {})
    changed = (f' (this config differs from it in: {"; ".join(c.describe() for c in changes)})' if changes
               else ' (with this same config; its results are in results.json)')
  return (f'{workdir} already holds a fine-tuning run{changed}; nothing in it was changed. Choose a new --workdir, '
          'or delete that one to redo it')


def _save_best(mngr: ocp.CheckpointManager, step: int, state: Any, cfg_dict: dict) -> None:
  mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(nnx.to_pure_dict(state['params'])),
                                          config=ocp.args.JsonSave(cfg_dict)), force=True)


def _better(metric: str, new: float, old: float | None) -> bool:
  return old is None or (new < old if metric in _LOWER_IS_BETTER else new > old)


def run(cfg: ml_collections.ConfigDict, workdir: str | Path) -> dict[str, Any]:
  """Fine-tunes per cfg in workdir; returns the results dict also written to WORKDIR/results.json."""
  workdir = paths.resolve(workdir, '--workdir')
  source, model_cfg, tok, task = prepare(cfg, workdir)
  is_main = jax.process_index() == 0
  resolved = ml_collections.ConfigDict(cfg.to_dict())
  resolved.model = model_cfg
  resolved.data.tokenizer = tok.spec
  resolved.mesh = ml_collections.ConfigDict(train_config.mesh_shape(cfg))
  train_config.write(resolved, workdir)
  if is_main and hasattr(task, 'save'):
    task.save(workdir)
  mesh = shd.make_mesh(dict(cfg.mesh))
  t = cfg.train
  steps_per_epoch = task.steps_per_epoch()
  num_steps = int(t.num_steps) if t.num_steps > 0 else int(t.epochs) * steps_per_epoch
  tx, lr = state_lib.make_optimizer(cfg, num_steps)
  defs, state = state_lib.create(lambda: task.make_model(model_cfg, nnx.Rngs(int(cfg.seed))), tx, lr, mesh)
  if source is not None:
    state = state_lib.load_encoder(defs, state, source_lib.encoder_params(source.flat))
  if is_main:
    n_params = sum(x.size for x in jax.tree.leaves(state['params']))
    log.info('%s; %d layers x %d, %s parameters, %d steps (%d per epoch), mesh %s', task.describe(),
             model_cfg.num_layers, model_cfg.hidden_size, f'{n_params:,}', num_steps, steps_per_epoch, dict(mesh.shape))

  keys = task.batch_keys
  train_step = step_lib.build_step(defs, task.loss, mesh, keys)
  forward = inference.jit_forward(defs.model_def, defs.shardings['params'], mesh)
  eval_bs = int(t.eval_batch_size)

  def predict(seqs):
    return inference.run_batched(forward, state['params'], seqs, eval_bs, task.buckets, tok.pad_id, mesh)

  writer = MetricsWriter(workdir, bool(cfg.logging.tensorboard))
  mngr = ckpt.make_manager(workdir, keep=1, async_save=False)
  pbar = None
  if is_main and cfg.logging.progress_bar:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    pbar = tqdm(total=num_steps, desc=f'finetune {task.kind}', unit='step', dynamic_ncols=True)
  eval_every = int(t.eval_every) or steps_per_epoch
  base_key = jax.random.key(int(cfg.seed))
  rng = np.random.default_rng(int(cfg.seed))
  best, final, evals = None, None, []
  pending, tokens, t0, timed = [], 0, time.perf_counter(), 0
  tokens_per_sec = []

  def flush(step: int) -> None:
    nonlocal pending, tokens, t0, timed
    if not pending:
      return
    host = jax.device_get(pending)
    if not all(bool(m['finite']) for m in host):
      raise FloatingPointError(f'non-finite loss or gradient by step {step}; lower --config.optimizer.lr')
    elapsed = max(time.perf_counter() - t0, 1e-9)
    out = {'loss': float(np.mean([m['loss'] for m in host])), 'grad_norm': float(np.mean([m['grad_norm'] for m in host])),
           'learning_rate': float(host[-1]['learning_rate']), 'tokens_per_sec': tokens / elapsed}
    if timed:
      tokens_per_sec.append(out['tokens_per_sec'])
    writer.write(step, out)
    if pbar is not None:
      pbar.set_postfix({'loss': f'{out["loss"]:.4f}', 'tok/s': f'{out["tokens_per_sec"]:,.0f}'}, refresh=False)
    pending, tokens, t0, timed = [], 0, time.perf_counter(), 0

  def evaluate(step: int) -> None:
    nonlocal best, final
    flush(step)
    ev = task.evaluate(predict)
    writer.write(step, ev, prefix='eval')
    evals.append({'step': step, **ev})
    final = {'step': step, 'metrics': ev}
    if _better(task.metric, ev[task.metric], None if best is None else best['metrics'][task.metric]):
      best = final
      _save_best(mngr, step, state, resolved.to_dict())
    if is_main:
      msg = f'eval step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in ev.items())
      (pbar.write if pbar is not None else log.info)(msg)

  step = 0
  try:
    while step < num_steps:
      for batch in task.train_epoch(rng):
        g = batching.to_global({k: batch[k] for k in keys}, mesh)
        state, m = train_step(state, g, jax.random.fold_in(base_key, step))
        step += 1
        pending.append(m)
        if step == 1:  # the first step includes compilation: start the throughput clock after it
          jax.block_until_ready(m)
          pending, tokens, t0, timed = [m], 0, time.perf_counter(), 0
        else:
          tokens += int(sum(batch[k].sum() for k in batch if k.endswith('lengths')))
          timed += 1
        if pbar is not None:
          pbar.update(1)
        if step % int(t.log_every) == 0 or step == num_steps:
          flush(step)
        if step % eval_every == 0 or step == num_steps:
          evaluate(step)
          t0 = time.perf_counter()
        if step >= num_steps:
          break
    mngr.wait_until_finished()
  finally:
    if pbar is not None:
      pbar.close()
    writer.close()
    mngr.close()
  results = {'task': cfg.task, 'kind': task.kind, 'metric': task.metric, 'final': final, 'best': best,
             'num_steps': num_steps, 'train_examples': task.num_train,
             'train_tokens_per_sec': float(np.median(tokens_per_sec)) if tokens_per_sec else None, 'evals': evals}
  if is_main:
    paths.write_text(workdir / RESULTS_FILE, json.dumps(results, indent=2) + '\n')
  if cfg.export.dir and is_main:
    from neobert_jax.finetune import export as export_lib  # pylint: disable=g-import-not-at-top
    results['export'] = str(export_lib.export_run(workdir, cfg.export.dir, overwrite=True))
  return results
