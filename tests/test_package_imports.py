"""The package's import direction, read from the source (ast, function-level imports included; nothing is run).

LAYERS below lists the layers, lowest first, each with its rule in one sentence; docs/architecture.md names the
same layers in the same order (tests/test_docs.py checks it). A module imports only its own layer and the layers
below it; RULES add what one sentence per layer leaves open (model and data do not import each other, nor do train
and convert). Nothing imports cli (console scripts); the benchmark scripts live outside the package (benchmarks/),
so nothing in it can import them. An import cycle between modules fails, even when it is hidden in a function body.
Only engine/ and weights/ import Orbax: one checkpoint writer (engine/checkpoint.py), one reader (weights/runs.py).

Known debt is listed in KNOWN with the reason; a rule that only finds known debt is an expected failure (xfail),
and it passes by itself once the debt is paid. A new violation fails.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / 'neobert_jax'

# (importer, imported) pairs that break a rule today, out of this change's scope, with why they exist.
KNOWN: dict[tuple[str, str], str] = {}


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(PKG.parent).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(PKG.rglob('*.py'))}


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """The package modules `name` imports anywhere in its file (module level or inside functions)."""
  package = name if path.name == '__init__.py' else name.rpartition('.')[0]
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:  # relative: from . import x / from ..y import z
        anchor = package.split('.')
        anchor = anchor[: len(anchor) - node.level + 1]
        base = '.'.join(anchor + ([base] if base else []))
      # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
      targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in known else base for a in node.names]
    else:
      continue
    for t in targets:
      while t and t not in known:  # `import neobert_jax.a.b` of a name we do not list: its nearest module
        t = t.rpartition('.')[0]
      if t and t.startswith('neobert_jax') and t != name:
        out.add(t)
  return out


def _graph() -> dict[str, set[str]]:
  mods = _modules()
  graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
  # Importing a module runs its packages' __init__ first; an edge to one's own ancestor package is not a cycle.
  return {name: {t for t in deps if not name.startswith(t + '.')} for name, deps in graph.items()}


def _in(name: str, *areas: str) -> bool:
  return any(name == f'neobert_jax.{a}' or name.startswith(f'neobert_jax.{a}.') for a in areas)


def _entry(name: str) -> bool:
  """The entry-point layer (LAYERS): cli.py and each package's __main__, which may import anything."""
  return name == 'neobert_jax.cli' or name.endswith('.__main__')


COMMANDS = ('jobs', 'finetune', 'evaluate', 'embed', 'aot', 'compile', 'cli')

# (layer, its areas (a module or subpackage of neobert_jax), its rule), lowest first.
LAYERS = (
  (
    'base',
    ('errors', 'jax_compat', 'paths', 'bucket', 'lease', 'commandline', 'hardware', 'host_memory'),
    'imports nothing of ours but errors (lease: errors and paths)',
  ),
  ('mesh', ('sharding', 'distributed'), 'the device mesh and multi-host start-up: imports only base'),
  ('config', ('config',), 'every config section, its defaults, types and validation: imports base and mesh'),
  ('model and data', ('model', 'data'), 'the encoder and the data pipeline: each imports its own config section'),
  ('weights', ('weights',), 'every way parameters reach a model or leave it: imports the layers below'),
  ('engine', ('engine',), 'the one trainer and checkpoint writer: imports no task'),
  ('train and convert', ('train', 'convert'), 'pretraining and Hugging Face conversion, side by side'),
  ('downstream', ('downstream',), 'what fine-tuning, embed and evaluate share: imports none of them'),
  ('commands', ('jobs', 'finetune', 'evaluate', 'embed', 'aot', 'compile'), 'the jobs the commands run'),
  ('entry points', ('cli', '__main__'), 'flags and one-line errors: import anything; nothing imports them'),
)


def layer_of(name: str) -> int:
  """The index in LAYERS of module `name` (an entry point wherever it lives)."""
  if _entry(name):
    return len(LAYERS) - 1
  for i, (_, areas, _) in enumerate(LAYERS):
    if _in(name, *areas):
      return i
  raise AssertionError(f'{name} belongs to no layer: add it to LAYERS (and to docs/architecture.md)')


RULES = {
  'errors, jax_compat and host_memory import nothing of ours': lambda a, b: _in(
    a, 'errors', 'jax_compat', 'host_memory'
  ),
  'paths (local paths and bucket URLs) and commandline (the CLI convention) import only errors and bucket': lambda a, b: (
    _in(a, 'paths', 'commandline', 'bucket') and not _in(b, 'errors', 'bucket')
  ),
  'lease (one writer per run) imports only errors and paths': lambda a, b: (
    _in(a, 'lease') and not _in(b, 'errors', 'paths', 'bucket')
  ),
  'weights (the parameter layer) imports only base, sharding, config, model and data': lambda a, b: (
    _in(a, 'weights')
    and not _in(b, 'weights', 'errors', 'paths', 'bucket', 'jax_compat', 'sharding', 'config', 'model', 'data')
  ),
  'model and data do not import weights, train, convert or anything above (of config, only their sections)': lambda a, b: (
    _in(a, 'model', 'data')
    and (
      _in(b, 'weights', 'train', 'convert', *COMMANDS)
      or (_in(b, 'config') and not _in(b, 'config.model', 'config.data'))
    )
  ),
  'the online pipeline (data.pipeline) imports nothing of the offline side (data.prepare) but the built-in corpus': (
    lambda a, b: _in(a, 'data.pipeline') and _in(b, 'data.prepare') and not _in(b, 'data.prepare.corpus')
  ),
  'the offline side (data.prepare) does not import the online pipeline (data.pipeline)': lambda a, b: (
    _in(a, 'data.prepare') and _in(b, 'data.pipeline')
  ),
  "data's shared base (shards, tokenizer, assets) imports neither data.prepare nor data.pipeline": (
    lambda a, b: (
      _in(a, 'data') and not _in(a, 'data.prepare', 'data.pipeline') and _in(b, 'data.prepare', 'data.pipeline')
    )
  ),
  'model and data do not import each other': lambda a, b: (
    (_in(a, 'model') and _in(b, 'data')) or (_in(a, 'data') and _in(b, 'model'))
  ),
  'config (the one home of configs) sits below model and data: it imports only errors, paths and sharding': lambda a, b: (
    _in(a, 'config') and not _in(b, 'config', 'errors', 'paths', 'sharding')
  ),
  'engine (the one trainer) imports no task: not train, finetune, downstream, convert or the commands': lambda a, b: (
    _in(a, 'engine') and _in(b, 'train', 'finetune', 'downstream', 'convert', *COMMANDS)
  ),
  'model, data, weights and sharding do not import engine': lambda a, b: (
    _in(a, 'model', 'data', 'weights', 'sharding', 'config') and _in(b, 'engine')
  ),
  'convert does not import train or the commands above it (its entry point, convert/__main__, may)': lambda a, b: (
    _in(a, 'convert') and not _entry(a) and _in(b, 'train', *COMMANDS)
  ),
  'train does not import convert or the commands above it (its entry point, train/__main__, may)': lambda a, b: (
    _in(a, 'train') and not _entry(a) and _in(b, 'convert', *COMMANDS)
  ),
  'downstream (what finetune, evaluate and embed share) imports neither them nor the commands above': lambda a, b: (
    _in(a, 'downstream') and _in(b, *COMMANDS)
  ),
  'model, data, sharding and train do not import downstream': lambda a, b: (
    _in(a, 'model', 'data', 'sharding', 'train', 'convert', 'config') and _in(b, 'downstream')
  ),
  'nothing imports cli (console scripts)': lambda a, b: _in(b, 'cli'),
}


def _orbax_importers() -> list[str]:
  return sorted(name for name, path in _modules().items() if 'orbax' in _top_level_imports(path))


def test_every_module_imports_only_its_layer_and_the_ones_below():
  graph = _graph()
  _check({(a, b) for a, deps in graph.items() for b in deps if layer_of(b) > layer_of(a)})


def test_only_engine_and_weights_import_orbax():
  # One checkpoint writer (engine/checkpoint.py; fine-tuning's best step goes through it) and one reader of run
  # directories (weights/runs.py).
  found = {(name, 'orbax') for name in _orbax_importers() if not _in(name, 'engine', 'weights')}
  _check(found)
  assert 'neobert_jax.engine.checkpoint' in _orbax_importers()


def _check(found: set[tuple[str, str]]) -> None:
  new = sorted(found - set(KNOWN))
  assert not new, 'imports against the layering: ' + ', '.join(f'{a} -> {b}' for a, b in new)
  if found:
    pytest.xfail('known debt: ' + '; '.join(f'{a} -> {b} ({KNOWN[(a, b)]})' for a, b in sorted(found)))


@pytest.mark.parametrize('rule', sorted(RULES))
def test_import_direction(rule):
  graph = _graph()
  _check({(a, b) for a, deps in graph.items() for b in deps if RULES[rule](a, b)})


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_import_cycles():
  graph = _graph()
  cycles = _cycles(graph)
  # A cycle is known debt when removing the known edges breaks it.
  pruned = {a: {b for b in deps if (a, b) not in KNOWN} for a, deps in graph.items()}
  new = _cycles(pruned)
  assert not new, f'import cycles: {new}'
  if cycles:
    pytest.xfail(f'known debt: {cycles}')


def _area(name: str) -> str:
  return '.'.join(name.split('.')[:2])  # neobert_jax.train.pretraining -> neobert_jax.train


def test_no_cycles_between_subpackages():
  # Entry points (a package's __main__) sit above every layer, whichever folder holds them: train/__main__'s job
  # joins train/ and convert/, and that is no cycle between the layers.
  graph = {a: deps for a, deps in _graph().items() if not _entry(a)}
  areas = lambda keep: {  # noqa: E731
    _area(a): {
      _area(b)
      for a2, deps in graph.items()
      if _area(a2) == _area(a)
      for b in deps
      if _area(b) != _area(a) and keep(a2, b)
    }
    for a in graph
  }
  new = _cycles(areas(lambda a, b: (a, b) not in KNOWN))
  assert not new, f'subpackages that import each other: {new}'
  cycles = _cycles(areas(lambda a, b: True))
  if cycles:
    pytest.xfail(f'known debt: {cycles} import each other (see KNOWN)')


def test_train_and_convert_share_the_parameter_layer():
  # Both read run directories and the Hugging Face layout through weights/; neither imports the other (the
  # end-of-run export joins them in the pretraining job, jobs/pretrain.py, in the commands layer above both).
  graph = _graph()
  between = sorted(
    (a, b)
    for a, deps in graph.items()
    for b in deps
    if not _entry(a) and ((_in(a, 'convert') and _in(b, 'train')) or (_in(a, 'train') and _in(b, 'convert')))
  )
  assert not between, f'train and convert import each other: {between}'
  assert {'neobert_jax.weights.runs', 'neobert_jax.weights.hf'} <= graph['neobert_jax.convert.export_hf']
  assert 'neobert_jax.weights.source' in graph['neobert_jax.train.mlm']
  assert {'neobert_jax.train.pretraining', 'neobert_jax.convert.export_hf'} <= graph['neobert_jax.jobs.pretrain']


# What reads weights off disk: the low-level readers of each format. Only weights/ may call them; everything else
# opens a source or reads a run through weights/ (one set of checks and errors for every command).
_WEIGHT_READERS = {'safe_open', 'load_file', 'StandardCheckpointer', 'PyTreeCheckpointer'}


def _reads_weights(path: pathlib.Path) -> bool:
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Attribute) and (
      node.attr in _WEIGHT_READERS
      or (node.attr == 'load' and isinstance(node.value, ast.Name) and node.value.id == 'torch')
    ):
      return True
    if isinstance(node, ast.ImportFrom) and any(a.name in _WEIGHT_READERS for a in node.names):
      return True
  return False


def test_only_the_weights_layer_reads_weight_files():
  readers = sorted(name for name, path in _modules().items() if _reads_weights(path))
  assert readers and all(_in(name, 'weights') for name in readers), readers
  assert not (PKG / 'checkpoint_io.py').exists() and not (PKG / 'model' / 'hf_layout.py').exists()


def _top_level_imports(path: pathlib.Path) -> set[str]:
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out |= {a.name.split('.')[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      out.add(node.module.split('.')[0])
  return out


def test_benchmarks_live_outside_the_package():
  # Benchmark scripts run from a checkout (python -m benchmarks.<name>): the installed package neither holds nor
  # imports them.
  scripts = {p.stem for p in (PKG.parent / 'benchmarks').glob('*.py')}
  assert {'train_step', 'data_pipeline', 'prepare', 'downstream'} <= scripts
  assert not (PKG / 'bench').exists()
  importers = sorted(name for name, path in _modules().items() if 'benchmarks' in _top_level_imports(path))
  assert not importers, f'the package imports benchmark scripts: {importers}'


def test_the_walker_sees_function_level_imports():
  # An import cycle can hide in function bodies (corpus -> prepare -> tokenizer -> corpus): the walker must
  # see imports there, and resolve `from pkg import module` to the module.
  graph = _graph()
  assert 'neobert_jax.data.assets' in graph['neobert_jax.data.tokenizer']
  assert 'neobert_jax.jobs.pretrain' in graph['neobert_jax.train.__main__']  # imported inside a function


def test_the_train_command_runs_the_pretraining_job_and_names_say_one_role():
  # `python -m neobert_jax.train` holds its flags and calls jobs/pretrain.pretrain (lease -> train -> export ->
  # report), which tests and benchmarks call too: none of them imports the command's __main__. One loop.py at most,
  # so a module's name says which loop it is.
  assert not (PKG / 'pretrain.py').exists()
  loops = sorted(str(p.relative_to(PKG)) for p in PKG.rglob('loop.py'))
  assert len(loops) <= 1, loops
  graph = _graph()
  assert 'neobert_jax.train.pretraining' in graph['neobert_jax.jobs.pretrain']
  assert 'neobert_jax.jobs.pretrain' in graph['neobert_jax.train.__main__']


def _imported_modules(path: pathlib.Path) -> set[str]:
  """Every module a file imports, anywhere in it (`from a import b` counts as a.b too)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      out |= {node.module} | {f'{node.module}.{a.name}' for a in node.names}
  return out


def test_no_test_or_benchmark_imports_a_main_and_every_main_is_flags():
  """Commands are jobs (neobert_jax/jobs/) that tests and benchmarks call; a command's __main__.py
  holds its flags and calls its job, and nothing but the console scripts (cli.py) imports it."""
  users = sorted(
    f'{p.relative_to(PKG.parent)}: {m}'
    for p in [*(PKG.parent / 'tests').rglob('*.py'), *(PKG.parent / 'benchmarks').glob('*.py')]
    for m in _imported_modules(p)
    if m.startswith('neobert_jax') and m.endswith('__main__')
  )
  assert not users, users
  mains = {str(p.relative_to(PKG)): len(p.read_text().splitlines()) for p in PKG.rglob('__main__.py')}
  assert max(mains.values()) <= 130, mains  # flags, the call and its one-line errors: no job inside


def test_no_two_package_classes_share_a_name():
  """One meaning per name: a class name names one class in the package (hf_modeling/ is the Hugging Face model file
  shipped verbatim into exports, in transformers' own naming, and is left out)."""
  where: dict[str, list[str]] = {}
  for name, path in _modules().items():
    if '.hf_modeling' in name:
      continue
    for node in ast.parse(path.read_text(), str(path)).body:
      if isinstance(node, ast.ClassDef):
        where.setdefault(node.name, []).append(name)
  shared = {cls: mods for cls, mods in where.items() if len(mods) > 1}
  assert not shared, f'class names used twice: {shared}'
