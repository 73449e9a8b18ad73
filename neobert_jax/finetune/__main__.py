"""Fine-tune a pretrained NeoBERT for classification, regression or contrastive sentence embeddings.

  python -m neobert_jax.finetune --config=configs/finetune_classification.py --workdir=W [--config.x.y=v ...]

The config's `task` field picks classification (also regression) or contrastive; exit statuses as train's.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from neobert_jax import commandline

_PROG = 'finetune'
_FLAGS = flags.FlagValues()  # this command's own, as train's: several commands can be imported in one process
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Fine-tuning config (configs/finetune_*.py).', flag_values=_FLAGS, lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  'workdir',
  None,
  'Run directory: config.json, labels.json, best checkpoint, metrics.jsonl, tensorboard/, results.json.',
  flag_values=_FLAGS,
)


def main(argv: list[str]) -> int:
  del argv  # run() refuses positional arguments
  from neobert_jax import distributed, jax_compat  # pylint: disable=g-import-not-at-top

  distributed.initialize()
  commandline.configure_logging()
  jax_compat.quiet_backend_probe()  # no "Unable to initialize backend 'tpu'" line at INFO on CPU / GPU machines
  from neobert_jax.jobs import finetune as finetune_job  # pylint: disable=g-import-not-at-top

  return finetune_job.finetune_command(_CONFIG.value, _WORKDIR.value)


def run() -> None:
  """The command line (neobert_jax/commandline.py): parse flags, fine-tune, exit with the status."""
  fields = 'neobert_jax/config/finetune.py'
  commandline.run_absl(
    _PROG, 'neobert_jax.finetune', __doc__, _FLAGS, main, required=('config', 'workdir'), fields_doc=fields
  )


if __name__ == '__main__':
  run()
