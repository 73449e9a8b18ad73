"""python -m neobert_jax.train --config=configs/neobert_250m.py --workdir=runs/x [--config.section.field=value ...]

Re-running the same command resumes from the latest complete checkpoint in the workdir. SIGTERM saves a checkpoint
and exits with status 0; a non-finite loss exits with status 3 naming the last good checkpoint. An expected error
(config, data, checkpoint, export, distributed: neobert_jax/errors.py) is one line on stderr with its own exit
status; --debug shows the traceback instead. `neobert-train` and the repository's train.py run this same `run()`.
"""

from __future__ import annotations

import logging
import re
import sys

from absl import app, flags
from ml_collections import config_flags

from neobert_jax import errors

_PROG = 'train'
_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training config file (configs/*.py).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory: checkpoints, config.json, metrics, TensorBoard.')
flags.mark_flags_as_required(['config', 'workdir'])
# Declared for --help only: run() takes --debug out of argv before the flags are parsed.
flags.DEFINE_bool('debug', False, 'On an expected error, show the Python traceback instead of one line.')


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise errors.ConfigError(f'unexpected arguments {argv[1:]}; flags take the form --name=value (see --help)')
  # Multi-host bring-up must precede the first device query; with no multi-process environment it does nothing.
  from neobert_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize()
  import jax  # pylint: disable=g-import-not-at-top
  from neobert_jax import jax_compat  # pylint: disable=g-import-not-at-top
  from neobert_jax import pretrain  # pylint: disable=g-import-not-at-top
  from neobert_jax.train import config as config_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.train import loop  # pylint: disable=g-import-not-at-top

  jax_compat.quiet_backend_probe()  # no "Unable to initialize backend 'tpu'" line on CPU / GPU machines
  logging.basicConfig(level=logging.INFO if jax.process_index() == 0 else logging.WARNING,
                      format='%(asctime)s %(levelname)s %(message)s', datefmt='%H:%M:%S', force=True)
  # Orbax and Grain narrate every file they write at INFO (through absl); keep their warnings and errors only.
  logging.getLogger('absl').setLevel(logging.WARNING)
  cfg = _CONFIG.value
  config_lib.validate(cfg)
  try:
    result = pretrain.run(cfg, _WORKDIR.value)  # train, then the Hugging Face export and the report
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


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, where a bad flag, override or config file is one config-error line (absl's own report
  is two lines, and an unknown override key is a traceback)."""
  with errors.reported(_PROG, errors.take_debug_flag([])):
    try:
      argv = flags.FLAGS(argv)
    except flags.Error as e:
      raise errors.ConfigError(f'{errors.one_line(e)} (see --help)') from e
    except (AttributeError, KeyError) as e:  # ml_collections: an override names a field the config lacks
      from neobert_jax import config as schema  # pylint: disable=g-import-not-at-top
      for arg in argv:  # a field that moved: name its new home
        key = arg.partition('=')[0].removeprefix('--config.')
        if key in schema.RENAMED:
          raise schema.unknown_key(key) from e
      text = errors.one_line(e).replace('\\n', ' ').replace("\\'", "'")
      key, hint = re.search(r"'(\w+)'", text), re.search(r'Did you mean "(\w+)"', text)
      raise errors.ConfigError(
          f'a --config.* override names a field the config does not have'
          f'{f" ({key.group(1)!r})" if key else ""}; {f"did you mean {hint.group(1)!r}? " if hint else ""}'
          'every field is listed in neobert_jax/config/base.py') from e
    try:
      _CONFIG.value.keys()  # config_flags defers a file that failed to load until the first access
    except OSError as e:
      raise errors.ConfigError(f'--config={config_flags.get_config_filename(flags.FLAGS["config"])}: '
                               f'{str(e).strip().splitlines()[-1].strip()}') from e
    return argv


def run() -> None:
  """The command line: parse flags, train, exit with the status (an expected error: one line, its status)."""
  debug = errors.take_debug_flag(sys.argv)
  # --help lists the flags of the module named by argv[0]: this one, train.py or the neobert-train script.
  for name in ('config', 'workdir', 'debug'):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])

  def _main(argv: list[str]) -> None:
    with errors.reported(_PROG, debug):
      sys.exit(main(argv))

  app.run(_main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
