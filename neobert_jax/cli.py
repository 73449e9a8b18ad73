"""Console-script entry points (pyproject.toml's [project.scripts]): one function per command.

Owns nothing but the glue: each function runs the command's own main exactly as `python -m <module>` does (same
flags, same error reporting, same exit status). Nothing in the package imports this module; it imports each
command lazily so that `neobert-prepare --help` does not pay for jax.
"""

from __future__ import annotations

import sys


def train() -> None:
  """neobert-train: python -m neobert_jax.train."""
  from neobert_jax.train import __main__ as train_main  # pylint: disable=g-import-not-at-top
  train_main.run()


def prepare() -> None:
  """neobert-prepare: python -m neobert_jax.data.prepare (its main returns the manifest; the status is 0)."""
  from neobert_jax.data import prepare as prepare_lib  # pylint: disable=g-import-not-at-top
  prepare_lib.main()


def convert() -> None:
  """neobert-convert: python -m neobert_jax.convert."""
  from neobert_jax.convert import __main__ as convert_main  # pylint: disable=g-import-not-at-top
  sys.exit(convert_main.main())


def compile_main() -> None:
  """neobert-compile: python -m neobert_jax.compile (absl flags; --debug is passed on to its compile child)."""
  from neobert_jax import compile as compile_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax import errors  # pylint: disable=g-import-not-at-top
  errors.take_debug_flag(sys.argv)
  _run_absl(compile_lib, errors.reports_errors('compile')(compile_lib.main))


def finetune() -> None:
  """neobert-finetune: python -m neobert_jax.finetune."""
  from neobert_jax.finetune import __main__ as finetune_main  # pylint: disable=g-import-not-at-top
  _run_absl(finetune_main, finetune_main.main)


def evaluate() -> None:
  """neobert-evaluate: python -m neobert_jax.evaluate."""
  from neobert_jax.evaluate import __main__ as evaluate_main  # pylint: disable=g-import-not-at-top
  sys.exit(evaluate_main.main())


def embed() -> None:
  """neobert-embed: python -m neobert_jax.embed."""
  from neobert_jax import embed as embed_lib  # pylint: disable=g-import-not-at-top
  sys.exit(embed_lib.main())


def _run_absl(module, main) -> None:
  """app.run(main) with --help listing `module`'s flags (absl lists those of the module named by argv[0], which
  for a console script is the script, not the module that defines them) and without the backend-probe noise."""
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from neobert_jax import jax_compat  # pylint: disable=g-import-not-at-top
  jax_compat.quiet_backend_probe()  # absl's log handler would print jax's libtpu probe line on CPU / GPU machines
  for flag in flags.FLAGS.get_key_flags_for_module(module):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  app.run(lambda argv: sys.exit(main(argv)))
