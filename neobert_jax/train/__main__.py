"""Pretrain (or continue pretraining) NeoBERT from a recipe file, resuming from the run directory's latest checkpoint.

  python -m neobert_jax.train --config=configs/neobert_250m.py --workdir=runs/x [--config.section.field=value ...]

Exit statuses: docs/fault-matrix.md. This module holds only the flags; the job (jobs/pretrain.py) is imported when
it runs, so that `--help` and a bad flag do not pay for jax.
"""

from __future__ import annotations

import logging
from absl import flags
from ml_collections import config_flags

from neobert_jax import commandline, errors, host_memory

_PROG = 'train'
# This command's own flags (not absl's global FLAGS), so that importing several commands in one process is fine.
_FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Training config file (configs/*.py).', flag_values=_FLAGS, lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  'workdir', None, 'Run directory: checkpoints, config.json, metrics, TensorBoard.', flag_values=_FLAGS
)


def main(argv: list[str]) -> int:
  del argv  # run() refuses positional arguments
  # Multi-host bring-up must precede the first device query; with no multi-process environment it does nothing.
  from neobert_jax import distributed  # pylint: disable=g-import-not-at-top

  distributed.initialize()
  import jax  # pylint: disable=g-import-not-at-top
  from neobert_jax import jax_compat  # pylint: disable=g-import-not-at-top

  jax_compat.quiet_backend_probe()  # no "Unable to initialize backend 'tpu'" line on CPU / GPU machines
  commandline.configure_logging(logging.INFO if jax.process_index() == 0 else logging.WARNING)
  from neobert_jax.jobs import pretrain as pretrain_job  # pylint: disable=g-import-not-at-top

  return pretrain_job.pretrain_command(_CONFIG.value, _WORKDIR.value)


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
