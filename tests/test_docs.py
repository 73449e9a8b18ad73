"""The README and docs/ say only what exists: links resolve, named files and tests exist, every command-line flag
they show is a flag of its command, and the architecture page names the layers the import test enforces.

Flags are read from the commands themselves: each package command's --help (absl and argparse alike, through
neobert_jax/commandline.py), run once for all of them in one subprocess; the scripts outside the package
(benchmarks/, launch/, a test run as a script) by reading their add_argument calls. A `--config.SECTION.FIELD`
override must name a field of the command's config schema.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import test_cli_convention
import test_package_imports

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / 'README.md', *(REPO / 'docs').rglob('*.md')])
# Subpackages whose paths the docs may give without the neobert_jax/ prefix (`engine/checkpoint.py`).
SUBPACKAGES = {p.name for p in (REPO / 'neobert_jax').iterdir() if (p / '__init__.py').is_file()}
TOP = {'neobert_jax', 'tests', 'configs', 'benchmarks', 'launch', 'docs', '.ci'}
# Commands with a config: which schema their --config.* overrides are checked against (launchers pass on train's).
SCHEMAS = {'neobert_jax.train': 'train', 'neobert_jax.compile': 'train', 'neobert_jax.finetune': 'finetune'}
SCHEMAS['neobert_jax.finetune.sweep'] = 'finetune'


def _rel(page: Path) -> str:
  return str(page.relative_to(REPO))


# --- what a page shows ---------------------------------------------------------------------------------------------

_FENCE = re.compile(r'^```.*?^```', re.S | re.M)
_SPAN = re.compile(r'`([^`]+)`')
_LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')


def _code(text: str) -> list[str]:
  """The page's code, one string per command line: fenced and indented blocks line by line (backslash
  continuations joined, comments dropped), then every inline code span."""
  out = []
  prose = _FENCE.sub(lambda m: out.extend(m.group(0).splitlines()[1:-1]) or '', text)
  kept, in_block, previous = [], False, ''
  for line in prose.splitlines():
    # An indented block starts after a blank line (an indented line after text continues a list item).
    in_block = line.startswith('    ') and (in_block or not previous.strip())
    if in_block:
      out.append(line.strip())
    else:
      kept.append(line)
    previous = line
  joined = []
  for line in out:
    if joined and joined[-1].endswith('\\'):
      joined[-1] = joined[-1][:-1] + ' ' + line.strip()
    else:
      joined.append(line.strip())
  joined = [line for line in joined if not line.startswith('#')]
  return joined + [' '.join(m.split()) for m in _SPAN.findall('\n'.join(kept))]


def _prose_links(text: str) -> list[str]:
  return _LINK.findall(_FENCE.sub('', text))


# --- commands and their flags --------------------------------------------------------------------------------------

_SCRIPTS = {
  name: target.removeprefix('neobert_jax.cli:')
  for name, target in tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['scripts'].items()
}
_SCRIPT_MODULE = {script: module for module, (_, script, _) in test_cli_convention.COMMANDS.items() if script}
OTHER = 'another program'


def _command_at(tokens: list[str], i: int) -> tuple[str | None, int]:
  """(the command starting at tokens[i], the index after its name), or (OTHER, ...) for another program, or
  (None, i) where no command starts. Package modules are named `neobert_jax...`, scripts by their path."""
  while i < len(tokens) and re.fullmatch(r'[A-Z_]+=\S*', tokens[i]):  # VAR=value prefixes
    i += 1
  if i >= len(tokens):
    return None, i
  word = tokens[i]
  name = word.rsplit('/', 1)[-1]
  if name in _SCRIPT_MODULE:
    return _SCRIPT_MODULE[name], i + 1
  if name in ('python', 'python3'):
    if tokens[i + 1 : i + 2] == ['-m'] and i + 2 < len(tokens):
      module = tokens[i + 2]
      return (module if module.split('.')[0] in ('neobert_jax', 'benchmarks') else OTHER), i + 3
    if i + 1 < len(tokens) and tokens[i + 1].endswith('.py'):
      script = tokens[i + 1]
      return ('neobert_jax.train' if script == 'train.py' else script), i + 2
  if word.startswith('-') or word in ('|', '&&', ';', '...'):
    return None, i
  return OTHER, i + 1


def _uses(line: str) -> list[tuple[str | None, str | None, str]]:
  """(command or None for a flag named on its own, subcommand word or None, flag) for every --flag in `line`."""
  tokens = re.sub(r'[()\[\]]', ' ', line).split()
  out = []

  def start(i: int, default: str | None = None) -> tuple[str | None, str | None, int]:
    command, i = _command_at(tokens, i)
    command = command or default
    # A subcommand is the bare word right after the command's name (convert to-pytorch, evaluate mteb).
    if command not in (None, OTHER) and i < len(tokens) and re.fullmatch(r'[a-z][a-z-]*', tokens[i]):
      return command, tokens[i], i + 1
    return command, None, i

  command, sub, i = start(0)
  while i < len(tokens):
    token = tokens[i]
    if token in ('&&', '|', ';'):
      command, sub, i = start(i + 1)
      continue
    if token == '--':  # a launcher hands the rest to the command after it, or to train's flags
      command, sub, i = start(i + 1, 'neobert_jax.train')
      continue
    if token.startswith('--') and len(token) > 2 and command is not OTHER:
      flag = token.split('=', 1)[0].rstrip('.,;:')
      if not flag.startswith('--xla_'):  # XLA's own flags, in XLA_FLAGS
        out.append((command, sub, flag))
    i += 1
  return out


_PROBE = r"""
import contextlib, io, json, re, runpy, sys, warnings
warnings.simplefilter('ignore')

def help_of(module, *sub):
  sys.argv = [module, *sub, '--help']
  out = io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
      runpy.run_module(module, run_name='__main__', alter_sys=True)
    except SystemExit:
      pass
  return out.getvalue()

result = {}
for module in json.loads(sys.argv[1]):
  text = help_of(module)
  choices = re.search(r'\{([\w,-]+)\}', text.split('\n\n')[0])
  result[module] = {'': text}
  for sub in (choices.group(1).split(',') if choices else ()):
    result[module][sub] = help_of(module, sub)
print(json.dumps(result))
"""
_FLAG = re.compile(r'(?<![\w-])(--[A-Za-z0-9][\w-]*)')


@pytest.fixture(scope='module')
def flags():
  """{module: {subcommand ('' for the command itself): set of flags}} of every package command, from --help."""
  modules = sorted(test_cli_convention.COMMANDS)
  r = subprocess.run(
    [sys.executable, '-c', _PROBE, json.dumps(modules)], capture_output=True, text=True, timeout=300, cwd=REPO
  )
  assert r.returncode == 0, r.stderr[-3000:]
  helps = json.loads(r.stdout.strip().splitlines()[-1])
  out = {m: {s: set(_FLAG.findall(text)) for s, text in subs.items()} for m, subs in helps.items()}
  for m, subs in out.items():
    assert '--help' in subs[''], f'{m} --help printed no flags'
  return out


def _script_flags(path: Path) -> set[str]:
  """The option strings of a script's add_argument calls (scripts outside the package are not run here)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Call) and getattr(node.func, 'attr', '') == 'add_argument':
      found |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith('--')}
  return found | {'--help'}


def _script_path(command: str) -> Path:
  if command.startswith('benchmarks.'):
    return REPO / (command.replace('.', '/') + '.py')
  return REPO / command


def _schema(name: str):
  if name == 'train':
    from neobert_jax.config import train

    return train.get_config()
  from neobert_jax.config import finetune

  return finetune.base_config()


def _has_field(cfg, dotted: str) -> bool:
  node = cfg
  for part in dotted.split('.'):
    if not hasattr(node, 'keys') or part not in node.keys():
      return False
    node = node[part]
  return True


def _override_problem(command: str | None, flag: str) -> str | None:
  dotted = flag.removeprefix('--config.')
  if not re.fullmatch(r'[a-z0-9_.]+', dotted):  # a placeholder: --config.SECTION.FIELD, --config.*
    return None
  names = [SCHEMAS[command]] if command in SCHEMAS else ['train', 'finetune']
  if any(_has_field(_schema(n), dotted) for n in names):
    return None
  return f'{flag}: no field {dotted} in the {" or ".join(names)} config'


def _flag_problem(flags, command: str | None, sub: str | None, flag: str) -> str | None:
  if flag.startswith('--config.'):
    return _override_problem(command, flag)
  if command is None:  # named on its own: some command must have it
    everything = set().union(*(f for subs in flags.values() for f in subs.values()))
    for script in [*(REPO / 'benchmarks').glob('*.py'), *(REPO / 'launch').rglob('*.py')]:
      everything |= _script_flags(script)
    return None if flag in everything else f'{flag}: no command has this flag'
  if command.startswith('neobert_jax'):
    if command not in flags:
      return f'{command}: not a command of the package (tests/test_cli_convention.py lists them)'
    known = flags[command][''] | flags[command].get(sub or '', set())
    return None if flag in known else f'{command}{" " + sub if sub else ""} has no flag {flag}'
  path = _script_path(command)
  if not path.is_file():
    return f'{command}: no such script'
  return None if flag in _script_flags(path) else f'{command} has no flag {flag}'


def test_every_flag_named_in_the_docs_exists(flags):
  problems = []
  for page in PAGES:
    for line in _code(page.read_text()):
      for command, sub, flag in _uses(line):
        problem = _flag_problem(flags, command, sub, flag)
        if problem:
          problems.append(f'{_rel(page)}: {problem}')
  assert not problems, '\n'.join(sorted(set(problems)))


def test_the_flag_reader_reads_commands_as_written():
  # The shapes the pages use: a console script, python -m with a subcommand, a launcher handing flags on, another
  # program's flags (ignored), a flag named on its own.
  assert _uses('neobert-prepare --input a --output=b') == [
    ('neobert_jax.data.prepare', None, '--input'),
    ('neobert_jax.data.prepare', None, '--output'),
  ]
  assert _uses('python -m neobert_jax.convert to-pytorch --checkpoint r') == [
    ('neobert_jax.convert', 'to-pytorch', '--checkpoint')
  ]
  assert _uses('python launch/local.py -n 2 --devices-per-process 2 -- python -m neobert_jax.train --workdir=x') == [
    ('launch/local.py', None, '--devices-per-process'),
    ('neobert_jax.train', None, '--workdir'),
  ]
  assert _uses('python launch/tpu/multislice.py gke --slices 2 -- --config.data.dir=d')[-1] == (
    'neobert_jax.train',
    None,
    '--config.data.dir',
  )
  assert _uses('pip install --no-deps -e .') == []
  assert _uses('--plan_workers') == [(None, None, '--plan_workers')]


# --- links and paths -----------------------------------------------------------------------------------------------


def test_every_relative_link_resolves():
  problems = []
  for page in PAGES:
    for target in _prose_links(page.read_text()):
      if re.match(r'[a-z]+:', target) or target.startswith('#'):
        continue
      path = (page.parent / target.split('#')[0]).resolve()
      if not path.exists():
        problems.append(f'{_rel(page)}: ({target}) does not exist')
  assert not problems, '\n'.join(problems)


def _repo_path(text: str) -> Path | None:
  """The repository file a code span names (`neobert_jax/paths.py`, `engine/checkpoint.py`, `tests/x.py`), or None
  for anything else (outputs such as runs/..., placeholders, URLs)."""
  text = text.split('::')[0].split(':')[0] if '::' in text or text.endswith('.py:original') else text
  if not re.fullmatch(r'\.?[\w./-]+', text) or '/' not in text or text.startswith(('/', 'gs:')):
    return None
  first = text.split('/')[0]
  if first in TOP:
    return REPO / text
  if first in SUBPACKAGES and (text.endswith(('.py', '/'))):
    return REPO / 'neobert_jax' / text
  return None


def test_every_file_and_test_named_in_the_docs_exists():
  problems = []
  for page in PAGES:
    text = page.read_text()
    for span in _SPAN.findall(text):
      for word in span.split():
        path = _repo_path(word.strip(',;'))
        if path is not None and not path.exists():
          problems.append(f'{_rel(page)}: {word} does not exist')
      for file, name in re.findall(r'(test_\w+\.py)::(test_\w+)', span):
        source = REPO / 'tests' / file
        if not source.is_file() or f'def {name}(' not in source.read_text():
          problems.append(f'{_rel(page)}: {file}::{name} is not a test')
  assert not problems, '\n'.join(problems)


# --- the architecture page and the import test ---------------------------------------------------------------------


def test_the_architecture_page_names_the_layers_of_the_import_test():
  page = (REPO / 'docs' / 'architecture.md').read_text()
  section = page.split('## Layers', 1)[1].split('\n## ', 1)[0]
  named = re.findall(r'^\d+\. \*\*([^*]+)\*\*', section, re.M)
  assert named == [name for name, _, _ in test_package_imports.LAYERS]
  for name, areas, _ in test_package_imports.LAYERS:
    item = re.split(r'\n\d+\. ', section.split(f'**{name}**', 1)[1], maxsplit=1)[0]
    for area in areas:
      assert f'`{area}' in item, f'docs/architecture.md: layer {name} does not name {area}'


# --- the testing page's module -> tests table ----------------------------------------------------------------------


def _module_table() -> dict[str, list[str]]:
  """docs/testing.md's "Which tests cover which module": {package module path: [test file names]}."""
  page = (REPO / 'docs' / 'testing.md').read_text()
  section = page.split('## Which tests cover which module', 1)[1].split('\n## ', 1)[0]
  rows = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if len(cells) == 2 and cells[0].startswith('`neobert_jax/'):
      rows[cells[0].strip('`')] = re.findall(r'`([^`]+)`', cells[1])
  return rows


def test_the_testing_page_maps_every_package_module_to_tests_that_exist():
  table = _module_table()
  modules = {str(p.relative_to(REPO)) for p in (REPO / 'neobert_jax').rglob('*.py') if p.name != '__init__.py'}
  missing, gone = sorted(modules - set(table)), sorted(set(table) - modules)
  assert not missing, f'docs/testing.md, "Which tests cover which module": add a row for each of {missing}'
  assert not gone, f'docs/testing.md, "Which tests cover which module": no such module: {gone} (remove the rows)'
  problems = [f'{module}: no test named' for module, tests in table.items() if not tests]
  problems += [
    f'{module}: tests/{name} does not exist'
    for module, tests in table.items()
    for name in tests
    if not (name.startswith('test_') and (REPO / 'tests' / name).is_file())
  ]
  assert not problems, 'docs/testing.md, "Which tests cover which module":\n' + '\n'.join(problems)


# --- the docs state the present ---------------------------------------------------------------------------------

# Phrases that narrate history instead of stating the present: a figure is dated by the calendar and given with its
# command, and what changed, and what it replaced, goes to CHANGELOG.md.
NARRATION = [
  r'(?<!test )\bsessions? \d',  # a numbered work period (a test file named test_session... is fine)
  r'\b(the session before|last session|this session)\b',
  r'\b(the )?(previous|last) (session|release|default|recipe|version)\b',
  r"\blast release's\b",
  r'\buntil (then|now)\b',
  r'\bbefore (this|the) (change|fix|study)\b',
  r'\bas it was before\b',
  r'\bas before\b',
  r'\bno longer\b',
  r'\bsince removed\b',
  r'\b(earlier|previous) (notes|figures|measurements|models|runs)\b',
  r'\bwas \d',  # "(was 24.7 ms)": an old figure beside the new one
  r'\b(cut|went|fell|dropped|rose|grew)( it)? from \d',  # "what cut it from 814 s"
  r'\bnow\b[^.|]*\binstead\b',  # "now does X instead of Y"
  r'(^|[.:;] )before, ',  # "Before, every host staged ..."
  r'\|\s*before\b',  # a "before" row or column of a table
  r'\bthe old (init|scorer|recipe|kernel|default|layout)\b',
]
_NARRATION = re.compile('|'.join(f'(?:{p})' for p in NARRATION), re.IGNORECASE)
# Pages and sections whose export figures are being measured again with docs/export.md: checked once they settle.
_NOT_YET = {'docs/export.md'}
_EXEMPT = {'docs/performance.md': '## The PyTorch export against ModernBERT'}
PERFORMANCE_MAX_LINES = 500  # one table per question with its command; the export section alone is 82 lines


def _narration(path: Path) -> list[str]:
  text = path.read_text(encoding='utf-8')
  exempt = _EXEMPT.get(_rel(path))
  if exempt and exempt in text:
    head, tail = text.split(exempt, 1)
    rest = tail.split('\n## ', 1)
    text = head + '\n' * (exempt.count('\n') + rest[0].count('\n')) + ('\n## ' + rest[1] if len(rest) > 1 else '')
  return [f'{_rel(path)}:{n}: {line.strip()}' for n, line in enumerate(text.splitlines(), 1) if _NARRATION.search(line)]


def test_the_docs_state_the_present_and_leave_history_to_the_changelog():
  """Docs state the present: a figure is dated by the calendar and its command, never by a numbered work period
  ('session 15', 'the session before') or against what came before ('until then', 'the previous default',
  '(was 24.7 ms)'). History goes to CHANGELOG.md."""
  found = [hit for page in PAGES if _rel(page) not in _NOT_YET for hit in _narration(page)]
  assert not found, 'narrating history (move it to CHANGELOG.md, or date the figure):\n' + '\n'.join(found)


def test_the_narration_patterns_catch_what_they_are_for():
  for line in [
    'as measured in session 15',
    'the session before measured 3 s',
    "8 x H100, remat full (last release's recipe)",
    'Until then the plan priced every layout at 50% MFU',
    'the kernel the previous release used',
    'XLA einsums (the previous default)',
    'FSDP and data parallel no longer tie',
    'all-reduce, 19.0 MiB (was 146.9 MiB)',
    'the planner now takes the shortest instead of the largest',
    'Before, every host staged the whole corpus.',
    '| before | 1,535 ms |',
    'evaluate lee before this change',
    'what cut it from 814 s was work not done twice',
  ]:
    assert _NARRATION.search(line), line
  for line in ['test_session.py covers it', 'the previous step is used', 'measured 2026-11-28', '| `before` | 5.946 |']:
    assert not _NARRATION.search(line), line


def test_the_performance_page_stays_short():
  lines = len((REPO / 'docs' / 'performance.md').read_text(encoding='utf-8').splitlines())
  assert lines <= PERFORMANCE_MAX_LINES, (
    f'docs/performance.md has {lines} lines (at most {PERFORMANCE_MAX_LINES}): keep one table per question with '
    'its command; history goes to CHANGELOG.md'
  )
