"""python -m neobert_jax.train --config=configs/neobert_250m.py --workdir=runs/x [--config.section.field=value ...]

Re-running the same command resumes from the latest complete checkpoint in the workdir. SIGTERM saves a checkpoint
and exits with status 0; a non-finite loss exits with status 3 naming the last good checkpoint.
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training config file (configs/*.py).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory: checkpoints, config.json, metrics, TensorBoard.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  # Multi-host bring-up must precede the first device query; with no multi-process environment it does nothing.
  from neobert_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize()
  import jax  # pylint: disable=g-import-not-at-top
  from neobert_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.train import loop  # pylint: disable=g-import-not-at-top

  logging.basicConfig(level=logging.INFO if jax.process_index() == 0 else logging.WARNING,
                      format='%(asctime)s %(levelname)s %(message)s', datefmt='%H:%M:%S', force=True)
  # Orbax and Grain narrate every file they write at INFO (through absl); keep their warnings and errors only.
  logging.getLogger('absl').setLevel(logging.WARNING)
  cfg = _CONFIG.value
  try:
    config_lib.validate(cfg)
  except config_lib.ConfigError as e:
    print(f'config error: {e}', file=sys.stderr)
    return 2
  try:
    result = loop.run(cfg, _WORKDIR.value)
  except loop.TrainingDiverged as e:
    print(f'training stopped: {e}', file=sys.stderr)
    return 3
  if jax.process_index() == 0:
    where = [f'workdir {result.workdir}', f'checkpoints {result.workdir / "checkpoints"}',
             f'metrics {result.workdir / "metrics.jsonl"}', f'tensorboard {result.workdir / "tensorboard"}']
    if cfg.export.hf_dir and not result.preempted:
      where.append(f'Hugging Face model {cfg.export.hf_dir}')
    status = 'preempted (SIGTERM), resumable' if result.preempted else 'finished'
    print(f'{status} at step {result.final_step}; ' + '; '.join(where))
    if result.evals:
      first, last = result.evals[0], result.evals[-1]
      print(f'held-out MLM loss {first["loss"]:.3f} (step {first["step"]}) -> {last["loss"]:.3f} '
            f'(step {last["step"]}), accuracy {last["accuracy"]:.3f}')
  return 0


if __name__ == '__main__':
  app.run(lambda argv: sys.exit(main(argv)))
