"""Console-script entry points (pyproject.toml's [project.scripts]): each runs its command exactly as `python -m`
does, imported lazily so that `neobert-prepare --help` does not pay for jax."""

from __future__ import annotations

import importlib
import sys


def _entry(module: str, function: str, exits: bool = False):
  """The console script that calls `module.function()`; with `exits`, its return value is the exit status."""

  def run() -> None:
    status = getattr(importlib.import_module(module), function)()
    if exits:
      sys.exit(status)

  return run


train = _entry('neobert_jax.train.__main__', 'run')
prepare = _entry('neobert_jax.data.prepare.local', 'main')  # its main returns the manifest; the status is 0
convert = _entry('neobert_jax.convert.__main__', 'main', exits=True)
compile_main = _entry('neobert_jax.compile', 'run')  # --debug is passed on to its compile child
finetune = _entry('neobert_jax.finetune.__main__', 'run')
evaluate = _entry('neobert_jax.evaluate.__main__', 'main', exits=True)
embed = _entry('neobert_jax.embed', 'main', exits=True)
