"""One meaning per name: no two classes of the package share a name, and no two modules define a public function of
the same name, so a name read anywhere means one thing. The one convention shared on purpose: a command module
(a `__main__.py`, or a module run with `python -m` that has the `__main__` guard) names its entry points `main`
(absl's, taking argv) and `run` (the console script's)."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

from tests.support.tiny_train import REPO_ROOT

PACKAGE = REPO_ROOT / 'neobert_jax'
ENTRY_POINT_NAMES = {'main', 'run'}


def _is_command(path: Path, source: str) -> bool:
  return path.name == '__main__.py' or "if __name__ == '__main__':" in source


def _definitions(kind: type) -> dict[str, list[str]]:
  found = collections.defaultdict(list)
  for path in sorted(PACKAGE.rglob('*.py')):
    source = path.read_text()
    for node in ast.parse(source).body:
      if not isinstance(node, kind) or node.name.startswith('_'):
        continue
      if node.name in ENTRY_POINT_NAMES and _is_command(path, source):
        continue
      found[node.name].append(str(path.relative_to(REPO_ROOT)))
  return found


def test_no_two_package_classes_share_a_name():
  shared = {name: where for name, where in _definitions(ast.ClassDef).items() if len(where) > 1}
  assert not shared, f'classes defined in more than one module (rename one): {shared}'


def test_no_two_modules_define_the_same_public_function():
  shared = {name: where for name, where in _definitions(ast.FunctionDef).items() if len(where) > 1}
  assert not shared, f'public functions defined in more than one module (rename one): {shared}'
