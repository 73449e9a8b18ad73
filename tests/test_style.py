"""The repository keeps one style: ruff's formatter and pyflakes-level lint, configured in pyproject.toml."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
  found = shutil.which('ruff', path=str(pathlib.Path(sys.executable).parent)) or shutil.which('ruff')
  if found is None:
    pytest.fail('ruff is not installed: pip install -e .[test] (the [lint] extra pins it)')
  return [found]


@pytest.mark.parametrize('args', [['check', '.'], ['format', '--check', '.']], ids=['lint', 'format'])
def test_ruff(args):
  done = subprocess.run(_ruff() + args, cwd=REPO, capture_output=True, text=True)
  assert done.returncode == 0, f'ruff {" ".join(args)} (fix with: ruff {args[0]} .):\n{done.stdout}{done.stderr}'
