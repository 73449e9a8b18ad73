"""Console-script entry points (pyproject.toml's [project.scripts]): each runs its command exactly as `python -m`
does, imported lazily so that `neobert-prepare --help` does not pay for jax."""

from __future__ import annotations

import sys


def train() -> None:
  """neobert-train: python -m neobert_jax.train."""
  from neobert_jax.train import __main__ as train_main  # pylint: disable=g-import-not-at-top

  train_main.run()


def prepare() -> None:
  """neobert-prepare: python -m neobert_jax.data.prepare (its main returns the manifest; the status is 0)."""
  from neobert_jax.data.prepare import local as prepare_lib  # pylint: disable=g-import-not-at-top

  prepare_lib.main()


def convert() -> None:
  """neobert-convert: python -m neobert_jax.convert."""
  from neobert_jax.convert import __main__ as convert_main  # pylint: disable=g-import-not-at-top

  sys.exit(convert_main.main())


def compile_main() -> None:
  """neobert-compile: python -m neobert_jax.compile (--debug is passed on to its compile child)."""
  from neobert_jax import compile as compile_lib  # pylint: disable=g-import-not-at-top

  compile_lib.run()


def finetune() -> None:
  """neobert-finetune: python -m neobert_jax.finetune."""
  from neobert_jax.finetune import __main__ as finetune_main  # pylint: disable=g-import-not-at-top

  finetune_main.run()


def evaluate() -> None:
  """neobert-evaluate: python -m neobert_jax.evaluate."""
  from neobert_jax.evaluate import __main__ as evaluate_main  # pylint: disable=g-import-not-at-top

  sys.exit(evaluate_main.main())


def embed() -> None:
  """neobert-embed: python -m neobert_jax.embed."""
  from neobert_jax import embed as embed_lib  # pylint: disable=g-import-not-at-top

  sys.exit(embed_lib.main())
