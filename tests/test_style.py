"""The repository keeps one style: ruff's formatter and pyflakes-level lint, configured in pyproject.toml; no dead
code (vulture, with tests/vulture_whitelist.py naming what only a framework calls); one alias per module; and no
package module over 450 lines."""

from __future__ import annotations

import ast
import collections
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PKG = REPO / 'neobert_jax'


def _tool(name: str) -> list[str]:
  found = shutil.which(name, path=str(pathlib.Path(sys.executable).parent)) or shutil.which(name)
  if found is None:
    pytest.fail(f'{name} is not installed: pip install -e .[test] (the [lint] extra pins it)')
  return [found]


@pytest.mark.parametrize('args', [['check', '.'], ['format', '--check', '.']], ids=['lint', 'format'])
def test_ruff(args):
  done = subprocess.run(_tool('ruff') + args, cwd=REPO, capture_output=True, text=True)
  assert done.returncode == 0, f'ruff {" ".join(args)} (fix with: ruff {args[0]} .):\n{done.stdout}{done.stderr}'


def test_no_dead_code():
  # Unused functions, classes, methods, variables and imports in the package, at vulture's default confidence.
  # A use anywhere in the checkout counts (the tests, the benchmarks and the recipes call the package too); what only
  # a framework reaches by name is in tests/vulture_whitelist.py, which stays short.
  args = ['neobert_jax', 'tests', 'benchmarks', 'configs', 'train.py', '--exclude', 'neobert_jax/convert/hf_modeling']
  done = subprocess.run(_tool('vulture') + args, cwd=REPO, capture_output=True, text=True)
  dead = [line for line in done.stdout.splitlines() if line.startswith('neobert_jax/')]
  assert not dead and not done.stderr, 'dead code (delete it, or whitelist what a framework calls):\n' + '\n'.join(
    dead + [done.stderr]
  )


def _module(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _aliases() -> list[tuple[str, str, str]]:
  """(alias, the module or name it stands for, where) for every `import x as y` / `from a import b as y` in the
  package (the exported Hugging Face model, in its upstream project's style, aside)."""
  out = []
  for path in sorted(PKG.rglob('*.py')):
    if 'hf_modeling' in path.parts:
      continue
    package = _module(path) if path.name == '__init__.py' else _module(path).rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        out += [(a.asname, a.name, f'{path.relative_to(REPO)}:{node.lineno}') for a in node.names if a.asname]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          anchor = package.split('.')[: len(package.split('.')) - node.level + 1]
          base = '.'.join(anchor + ([base] if base else []))
        where = f'{path.relative_to(REPO)}:{node.lineno}'
        out += [(a.asname, f'{base}.{a.name}', where) for a in node.names if a.asname]
  return out


def test_one_alias_per_module():
  # `import x as y` names one thing everywhere: an alias never stands for two modules, nor a module under two
  # aliases, so `config_lib.validate` means the same function in every file.
  targets, names = collections.defaultdict(set), collections.defaultdict(set)
  for alias, target, where in _aliases():
    targets[alias].add((target, where))
    names[target].add((alias, where))
  clashes = [
    f'alias {alias!r} names {sorted({t for t, _ in uses})} ({", ".join(sorted(w for _, w in uses))})'
    for alias, uses in sorted(targets.items())
    if len({t for t, _ in uses}) > 1
  ] + [
    f'{target} is imported as {sorted({a for a, _ in uses})} ({", ".join(sorted(w for _, w in uses))})'
    for target, uses in sorted(names.items())
    if len({a for a, _ in uses}) > 1
  ]
  assert not clashes, 'one alias per module:\n' + '\n'.join(clashes)


def test_every_package_module_reads_in_one_sitting():
  """No module of the package over 450 lines: past that, split it by job (docs/testing.md's table maps the parts)."""
  long = {
    str(path.relative_to(REPO)): n
    for path in sorted(PKG.rglob('*.py'))
    if (n := len(path.read_text().splitlines())) > 450
  }
  assert not long, f'modules over 450 lines, split them by job: {long}'
