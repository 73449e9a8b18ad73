"""python -m neobert_jax.finetune --config=configs/finetune_classification.py --workdir=W [--config.x.y=v ...]

The config's `task` field picks classification (also regression) or contrastive. Bad input (config, files, columns,
labels, a checkpoint of another vocabulary) exits with status 2 and one line naming the problem and the fix,
having written nothing.
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Fine-tuning config (configs/finetune_*.py).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory: config.json, labels.json, best checkpoint, '
                               'metrics.jsonl, tensorboard/, results.json.')
flags.mark_flags_as_required(['config', 'workdir'])


def run_cli(cfg, workdir: str) -> int:
  """Runs a fine-tuning job and prints its outcome; the exit status (0 ok, 2 bad input, 3 diverged)."""
  from neobert_jax.finetune import loop  # pylint: disable=g-import-not-at-top
  from neobert_jax.finetune.tables import DataError  # pylint: disable=g-import-not-at-top
  from neobert_jax.train.config import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    from neobert_jax.errors import NeobertError as expected  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover
    expected = DataError
  try:
    results = loop.run(cfg, workdir)
  except (ConfigError, DataError, expected) as e:
    print(f'finetune: error: {e}', file=sys.stderr)
    return 2
  except FloatingPointError as e:
    print(f'finetune: stopped: {e}', file=sys.stderr)
    return 3
  best, final = results['best'], results['final']
  metric = results['metric']
  print(f'finished {results["num_steps"]} steps; best {metric} {best["metrics"][metric]:.4f} at step '
        f'{best["step"]}, final {final["metrics"][metric]:.4f}; results {workdir}/results.json'
        + (f'; exported {results["export"]}' if 'export' in results else ''))
  return 0


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  from neobert_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize()
  logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s', datefmt='%H:%M:%S',
                      force=True)
  logging.getLogger('absl').setLevel(logging.WARNING)
  return run_cli(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  app.run(lambda argv: sys.exit(main(argv)))
