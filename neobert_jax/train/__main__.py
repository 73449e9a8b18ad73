"""Pretrain (or continue pretraining) NeoBERT from a recipe file, resuming from the run directory's latest checkpoint.

  python -m neobert_jax.train --config=configs/neobert_250m.py --workdir=runs/x [--config.section.field=value ...]

Re-running the same command resumes from the latest complete checkpoint in the workdir. SIGTERM saves a checkpoint
and exits with status 0; a non-finite loss exits with status 3 naming the last good checkpoint. An expected error
(config, data, checkpoint, export, distributed: neobert_jax/errors.py) is one line on stderr with its own exit
status; --debug shows the traceback instead. `neobert-train` and the repository's train.py run this same `run()`.

The job itself is `pretrain` below: the workdir's lease, then train/pretraining.train, the Hugging Face export and
the report. Its imports sit inside the functions, so that `--help` and a bad flag do not pay for jax.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import ml_collections
from absl import flags
from ml_collections import config_flags

from neobert_jax import commandline, errors, host_memory

if TYPE_CHECKING:  # the job imports it when it runs: --help and a bad flag do not pay for jax
  from neobert_jax.train.pretraining import RunResult

_PROG = 'train'
# This command's own flags (not absl's global FLAGS), so that importing several commands in one process is fine.
_FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Training config file (configs/*.py).', flag_values=_FLAGS, lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  'workdir', None, 'Run directory: checkpoints, config.json, metrics, TensorBoard.', flag_values=_FLAGS
)


def export(cfg: ml_collections.ConfigDict, workdir: str | Path) -> Path:
  """Writes the run's latest checkpoint, with the tokenizer its data was prepared with (recorded in the run's
  config.json, so the directory is usable on its own), as a Hugging Face NeoBERT directory. The directory belongs
  to this run, so a re-run replaces it (the converter writes it atomically)."""
  from neobert_jax.convert import export_hf  # pylint: disable=g-import-not-at-top

  out = export_hf.export_checkpoint(workdir, cfg.export.hf_dir, overwrite=True, use_ema=cfg.export.use_ema)
  logging.getLogger('neobert_jax.train').info('exported Hugging Face model to %s', out)
  return out


def pretrain(
  cfg: ml_collections.ConfigDict, workdir: str | Path, on_step: Callable[[int], None] | None = None
) -> RunResult:
  """The job this command runs, end to end, under one lease on the workdir (engine/session.claim, taken before
  anything there is read or written): train (train/pretraining.train: resume or initialise, step, checkpoint),
  then, on process 0 and unless SIGTERM stopped the run, the Hugging Face export of the final checkpoint
  (export.hf_dir, through convert/), then the report (train/report.py: held-out loss against the unigram
  baselines, the loss curve, fill-mask examples through that export). Re-running a finished run trains nothing and
  only exports (and reports) again. Returns the RunResult, with the config as the run resolved it.

  The job lives here, in the command's entry point, because it joins train/ and convert/, which do not import
  each other (tests/test_package_imports.py).
  """
  import jax  # pylint: disable=g-import-not-at-top

  from neobert_jax.engine import session  # pylint: disable=g-import-not-at-top
  from neobert_jax.train import pretraining, report  # pylint: disable=g-import-not-at-top

  with session.claim(workdir, cfg.run_id) as lease:
    result = pretraining.train(cfg, workdir, lease, on_step)
    if result.preempted or jax.process_index() != 0:
      return result
    if result.config.export.hf_dir:
      export(result.config, result.workdir)
    if result.final_step > 0:
      result.report = report.report(result.config, result.workdir, result.evals)
      if result.config.export.hf_dir:  # the card quotes the report's baselines and copies its curve
        from neobert_jax.convert import model_card  # pylint: disable=g-import-not-at-top

        model_card.refresh(result.config.export.hf_dir, result.workdir)
    return result


def main(argv: list[str]) -> int:
  del argv  # run() refuses positional arguments
  # Multi-host bring-up must precede the first device query; with no multi-process environment it does nothing.
  from neobert_jax import distributed  # pylint: disable=g-import-not-at-top

  distributed.initialize()
  import jax  # pylint: disable=g-import-not-at-top
  from neobert_jax import jax_compat  # pylint: disable=g-import-not-at-top

  jax_compat.quiet_backend_probe()  # no "Unable to initialize backend 'tpu'" line on CPU / GPU machines
  commandline.configure_logging(logging.INFO if jax.process_index() == 0 else logging.WARNING)
  try:
    result = pretrain(_CONFIG.value, _WORKDIR.value)
  except errors.TrainingDiverged as e:
    print(f'training stopped: {e}', file=sys.stderr)
    return 3
  if jax.process_index() == 0:
    where = [
      f'workdir {result.workdir}',
      f'checkpoints {result.workdir / "checkpoints"}',
      f'metrics {result.workdir / "metrics.jsonl"}',
      f'tensorboard {result.workdir / "tensorboard"}',
    ]
    if result.config.export.hf_dir and not result.preempted:
      where.append(f'Hugging Face model {result.config.export.hf_dir}')
    status = 'preempted (SIGTERM), resumable' if result.preempted else 'finished'
    print(f'{status} at step {result.final_step}; ' + '; '.join(where))
    if result.evals:
      first, last = result.evals[0], result.evals[-1]
      print(
        f'held-out MLM loss {first["loss"]:.3f} (step {first["step"]}) -> {last["loss"]:.3f} '
        f'(step {last["step"]}), accuracy {last["accuracy"]:.3f}'
      )
  return 0


def _renamed(key: str) -> errors.ConfigError | None:
  from neobert_jax import config as config_lib  # pylint: disable=g-import-not-at-top

  return config_lib.unknown_key(key) if key in config_lib.RENAMED else None


def run() -> None:
  """The command line (neobert_jax/commandline.py): parse flags, train, exit with the status."""
  host_memory.reexec_with_huge_pages()  # first: the process starts over with huge-page malloc where that helps
  commandline.run_absl(
    _PROG,
    'neobert_jax.train',
    __doc__,
    _FLAGS,
    main,
    required=('config', 'workdir'),
    fields_doc='neobert_jax/config/train.py',
    renamed=_renamed,
  )


if __name__ == '__main__':
  run()
