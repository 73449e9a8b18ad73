"""The pretraining job (`python -m neobert_jax.train`): lease, training, export, report and model card. It joins
train/ and convert/, which do not import each other, so it lives above both."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable

import jax
import ml_collections

from neobert_jax import errors, paths
from neobert_jax.convert import export_hf, model_card
from neobert_jax.engine import session
from neobert_jax.train import pretraining, report
from neobert_jax.weights import runs

log = logging.getLogger('neobert_jax.train')


def export(cfg: ml_collections.ConfigDict, workdir: str | Path) -> Path:
  """The run's latest checkpoint and its tokenizer as a Hugging Face directory (export.hf_dir), replaced on a re-run."""
  out = export_hf.export_checkpoint(workdir, cfg.export.hf_dir, overwrite=True, use_ema=cfg.export.use_ema)
  log.info('exported Hugging Face model to %s', out)
  return out


def pretrain(
  cfg: ml_collections.ConfigDict, workdir: str | Path, on_step: Callable[[int], None] | None = None
) -> pretraining.RunResult:
  """Under the workdir's lease: train, then (process 0, unless preempted) export, report, model card."""
  workdir = paths.resolve(workdir, '--workdir')  # the one resolution of the job's workdir
  with session.claim(workdir, cfg.run_id) as lease:
    result = pretraining.train(cfg, workdir, lease, on_step)
    if result.preempted or jax.process_index() != 0:
      return result
    hf_dir = result.config.export.hf_dir
    if hf_dir:
      export(result.config, workdir)
    if result.final_step > 0:
      result.report = report.report(result.config, workdir, result.evals, result.sources)
      if hf_dir:  # the card quotes the report's baselines and copies its curve
        model_card.refresh(hf_dir, workdir)
    return result


def pretrain_command(cfg: ml_collections.ConfigDict, workdir: str) -> int:
  """The train command: the job, its outcome printed on process 0; the exit status (3: diverged)."""
  try:
    result = pretrain(cfg, workdir)
  except errors.TrainingDiverged as e:
    print(f'training stopped: {e}', file=sys.stderr)
    return 3
  if jax.process_index() == 0:
    w = result.workdir
    where = [f'workdir {w}', f'checkpoints {w / "checkpoints"}', f'metrics {w / "metrics.jsonl"}']
    where.append(f'tensorboard {w / "tensorboard"}')
    if result.config.export.hf_dir and not result.preempted:
      where.append(f'Hugging Face model {result.config.export.hf_dir}')
    status = 'preempted (SIGTERM), resumable' if result.preempted else 'finished'
    print(f'{status} at step {result.final_step}; ' + '; '.join(where))
    item = runs.exported_item(result.config)
    if evals := report.shipped(result.evals, item):
      first, last = evals[0], evals[-1]
      whose = '' if item == runs.PARAMS_ITEM else ' of the moving average (the exported weights)'
      print(
        f'held-out MLM loss{whose} {first["loss"]:.3f} (step {first["step"]}) -> {last["loss"]:.3f} '
        f'(step {last["step"]}), accuracy {last["accuracy"]:.3f}'
      )
  return 0
