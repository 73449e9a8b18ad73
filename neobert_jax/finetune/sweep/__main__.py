"""Run the paper's GLUE hyper-parameter grid of fine-tuning jobs and report the best point.

  python -m neobert_jax.finetune.sweep --config=... --workdir=SWEEP
  learning rate {5e-6, 6e-6, 1e-5, 2e-5, 3e-5} x batch {4, 8, 16, 32} x weight decay {1e-2, 1e-5}

--lr / --batch / --weight_decay restrict the grid (comma-separated values). Each point is an ordinary fine-tuning
run in SWEEP/lr<lr>_bs<batch>_wd<wd>; a point whose results.json exists is read back, not re-run, so re-running the
same command resumes an interrupted sweep (a point cut off mid-run is started again). The table of best validation
scores and the best point are printed and written to SWEEP/sweep.json.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from neobert_jax import commandline, errors
from neobert_jax.jobs import finetune as finetune_job

_PROG = 'sweep'
_FLAGS = flags.FlagValues()  # this command's own: importing several commands in one process is fine
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Fine-tuning config (configs/finetune_*.py).', flag_values=_FLAGS, lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  'workdir', None, 'Sweep directory: one sub-directory per grid point.', flag_values=_FLAGS
)
_LR = flags.DEFINE_list('lr', [str(v) for v in finetune_job.GRID['lr']], 'Learning rates to try.', flag_values=_FLAGS)
_BATCH = flags.DEFINE_list(
  'batch', [str(v) for v in finetune_job.GRID['batch']], 'Global batch sizes to try.', flag_values=_FLAGS
)
_WEIGHT_DECAY = flags.DEFINE_list(
  'weight_decay', [str(v) for v in finetune_job.GRID['weight_decay']], 'Weight decays to try.', flag_values=_FLAGS
)


def main(argv: list[str]) -> int:
  del argv  # run() refuses positional arguments
  commandline.configure_logging()
  try:
    grid = ([float(v) for v in _LR.value], [int(v) for v in _BATCH.value], [float(v) for v in _WEIGHT_DECAY.value])
  except ValueError as e:
    raise errors.ConfigError(
      f'--lr / --batch / --weight_decay must be comma-separated numbers ({e}) (see --help)'
    ) from e
  print(finetune_job.format_sweep_table(finetune_job.run_sweep(_CONFIG.value, _WORKDIR.value, *grid)))
  return 0


def run() -> None:
  """The command line (neobert_jax/commandline.py), as finetune's: the same config file and overrides."""
  fields = 'neobert_jax/config/finetune.py'
  commandline.run_absl(
    _PROG, 'neobert_jax.finetune.sweep', __doc__, _FLAGS, main, required=('config', 'workdir'), fields_doc=fields
  )


if __name__ == '__main__':
  run()
