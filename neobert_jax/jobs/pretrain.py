"""The pretraining job: `python -m neobert_jax.train` runs `pretrain`, and so do the tests and benchmarks that run
the README's main job.

It joins train/ (training, the report) and convert/ (the Hugging Face export), which do not import each other
(tests/test_package_imports.py), so it lives above both.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import jax
import ml_collections

from neobert_jax.convert import export_hf, model_card
from neobert_jax.engine import session
from neobert_jax.train import pretraining, report

log = logging.getLogger('neobert_jax.train')


def export(cfg: ml_collections.ConfigDict, workdir: str | Path) -> Path:
  """Writes the run's latest checkpoint, with the tokenizer the run carries (weights/runs.py: WORKDIR/tokenizer/),
  as a Hugging Face NeoBERT directory. The directory belongs to this run, so a re-run replaces it (the converter
  writes it atomically)."""
  out = export_hf.export_checkpoint(workdir, cfg.export.hf_dir, overwrite=True, use_ema=cfg.export.use_ema)
  log.info('exported Hugging Face model to %s', out)
  return out


def pretrain(
  cfg: ml_collections.ConfigDict, workdir: str | Path, on_step: Callable[[int], None] | None = None
) -> pretraining.RunResult:
  """The job, end to end, under one lease on the workdir (engine/session.claim, taken before anything there is read
  or written): train (train/pretraining.train: resume or initialise, step, checkpoint), then, on process 0 and
  unless SIGTERM stopped the run, the Hugging Face export of the final checkpoint (export.hf_dir), then the report
  (train/report.py: held-out loss against the baselines, the loss curve, fill-mask examples through that export).
  Re-running a finished run trains nothing and only exports (and reports) again. Returns the RunResult, with the
  config as the run resolved it."""
  with session.claim(workdir, cfg.run_id) as lease:
    result = pretraining.train(cfg, workdir, lease, on_step)
    if result.preempted or jax.process_index() != 0:
      return result
    if result.config.export.hf_dir:
      export(result.config, result.workdir)
    if result.final_step > 0:
      result.report = report.report(result.config, result.workdir, result.evals, result.sources)
      if result.config.export.hf_dir:  # the card quotes the report's baselines and copies its curve
        model_card.refresh(result.config.export.hf_dir, result.workdir)
    return result
