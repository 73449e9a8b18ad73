"""The pretraining job as `python -m neobert_jax.train` (and `neobert-train`, `train.py`) runs it, end to end.

Owns the order of the end of a run: train (train/loop.run: resume or initialise, step, checkpoint), then, on
process 0 and unless SIGTERM stopped the run, the Hugging Face export of the final checkpoint (export.hf_dir,
through convert/), then the report (train/report.py: held-out loss against the unigram baselines, the loss curve,
fill-mask examples through that export). Re-running a finished run trains nothing and only exports (and reports)
again.

It sits above both train/ and convert/ (the commands layer) so that neither of those imports the other; only the
entry points import it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import jax
import ml_collections

from neobert_jax.convert import export_hf
from neobert_jax.engine import run as engine_run
from neobert_jax.train import loop
from neobert_jax.train import report as report_lib

log = logging.getLogger('neobert_jax.train')


def export(cfg: ml_collections.ConfigDict, workdir: str | Path) -> Path:
  """Writes the run's latest checkpoint, with the tokenizer its data was prepared with (recorded in the run's
  config.json, so the directory is usable on its own), as a Hugging Face NeoBERT directory. The directory belongs
  to this run, so a re-run replaces it (the converter writes it atomically)."""
  out = export_hf.export_checkpoint(workdir, cfg.export.hf_dir, overwrite=True, use_ema=cfg.export.use_ema)
  log.info('exported Hugging Face model to %s', out)
  return out


def run(
  cfg: ml_collections.ConfigDict, workdir: str | Path, on_step: Callable[[int], None] | None = None
) -> loop.RunResult:
  """Trains `cfg` in `workdir` (loop.run), then exports and reports as described above, with the config as the
  run resolved it."""
  with engine_run.claim(workdir, cfg.run_id) as held:  # one lease over training, export and report
    result = loop.run(cfg, workdir, on_step=on_step, lease=held)
    if result.preempted or jax.process_index() != 0:
      return result
    if result.config.export.hf_dir:
      export(result.config, result.workdir)
    if result.final_step > 0:
      result.report = report_lib.report(result.config, result.workdir, result.evals)
    return result
