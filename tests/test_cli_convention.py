"""Every command follows one command-line convention (neobert_jax/commandline.py; docs/architecture.md,
"Command-line conventions").

`--help` exits 0 and prints `usage: <command> ... [flags]`, one paragraph, then the flags (--help and --debug on
every command; --config and its overrides where there is a config); an unknown flag is one line
`<prog>: config error: ... (see --help)` on stderr with status 2. Checked for every command in each of its forms:
the console script (pyproject's [project.scripts] through neobert_jax/cli.py), `python -m <module>`, and train.py.

All forms run in one subprocess, in-process one after the other (the console script's function, or the module as
__main__ through runpy), so the whole check costs one interpreter start and the imports of the commands.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# module: (short name in its error lines, console script or None, has a config)
COMMANDS = {
  'neobert_jax.train': ('train', 'neobert-train', True),
  'neobert_jax.finetune': ('finetune', 'neobert-finetune', True),
  'neobert_jax.finetune.sweep': ('sweep', None, True),
  'neobert_jax.compile': ('compile', 'neobert-compile', True),
  'neobert_jax.data.prepare': ('prepare', 'neobert-prepare', False),
  'neobert_jax.convert': ('convert', 'neobert-convert', False),
  'neobert_jax.evaluate': ('evaluate', 'neobert-evaluate', False),
  'neobert_jax.embed': ('embed', 'neobert-embed', False),
  'neobert_jax.finetune.export': ('export', None, False),
  'neobert_jax.data.prepare.corpus': ('corpus', None, False),
  'neobert_jax.data.prepare.train_sentencepiece': ('train_sentencepiece', None, False),
  'neobert_jax.aot.deps': ('deps', None, False),
}
UNKNOWN = '--no-such-flag'

# Runs in the subprocess: argv[1] is a JSON list of (form, target); prints one JSON result per run.
_PROBE = r"""
import contextlib, io, json, runpy, sys, warnings
warnings.simplefilter('ignore')  # runpy: "found in sys.modules ... prior to execution" for a re-run module
from neobert_jax import cli

def entry(form, target):
  if form == 'script':  # target: (script name, cli function)
    return '/venv/bin/' + target[0], getattr(cli, target[1])
  if form == 'module':
    return 'ignored', lambda: runpy.run_module(target, run_name='__main__', alter_sys=True)
  return target, lambda: runpy.run_path(target, run_name='__main__')

runs, unknown, results = json.loads(sys.argv[1]), sys.argv[2], []
for form, target in runs:
  for flag in ('--help', unknown):
    argv0, run = entry(form, target)
    sys.argv = [argv0, flag]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        run()
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    results.append({'form': form, 'target': target, 'flag': flag, 'code': code, 'out': out.getvalue(),
                    'err': err.getvalue()})
print(json.dumps(results))
"""


def _scripts() -> dict[str, str]:
  """pyproject's console scripts: name -> cli function."""
  scripts = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['scripts']
  return {name: target.removeprefix('neobert_jax.cli:') for name, target in scripts.items()}


def _forms() -> list[tuple[str, object, str, str]]:
  """(form, target, module, the name its usage line shows) for every way of running every command."""
  by_script = {script: module for module, (_, script, _) in COMMANDS.items() if script}
  forms = [('script', (name, fn), by_script[name], name) for name, fn in _scripts().items()]
  forms += [('module', module, module, f'python -m {module}') for module in COMMANDS]
  forms.append(('path', 'train.py', 'neobert_jax.train', 'python -m neobert_jax.train'))
  return forms


def test_every_command_is_listed():
  # A new command (a module that runs as __main__) or console script must join the convention and this test.
  pkg = REPO / 'neobert_jax'
  mains = {
    '.'.join(p.relative_to(REPO).with_suffix('').parts).removesuffix('.__main__')
    for p in pkg.rglob('*.py')
    if "if __name__ == '__main__':" in p.read_text() or 'if __name__ == "__main__":' in p.read_text()
  }
  assert mains == set(COMMANDS)
  assert {script for _, script, _ in COMMANDS.values() if script} == set(_scripts())


def _help_problems(out: str, name: str, has_config: bool) -> list[str]:
  lines = out.splitlines()
  problems = []
  if not lines or not re.fullmatch(rf'usage: {re.escape(name)}( \S.*)? \[flags\]', lines[0]):
    problems.append(f'first line is not "usage: {name} ... [flags]": {lines[:1]}')
  if sum(line.startswith('usage:') for line in lines) != 1:
    problems.append('not exactly one usage line')
  blocks = out.split('\n\n')
  if len(blocks) < 3 or not blocks[1].strip() or blocks[1].lstrip().startswith(('-', 'usage', 'flags:')):
    problems.append('no description paragraph after the usage line')
  flags = out[out.find('\nflags:\n') :] if '\nflags:\n' in out else ''
  wanted = ['-h, --help', '--debug'] + (['--config FILE', '--config.FIELD VALUE'] if has_config else [])
  missing = [w for w in wanted if w not in flags]
  if missing:
    problems.append(f'the flags section lacks {missing}')
  return problems


def _error_problems(code: int, err: str, prog: str) -> list[str]:
  lines = err.strip().splitlines()
  problems = [] if code == 2 else [f'exit status {code}, expected 2']
  if len(lines) != 1 or not re.fullmatch(rf'{re.escape(prog)}: config error: .+ \(see --help\)', lines[0]):
    problems.append(f'stderr is not one "{prog}: config error: ... (see --help)" line')
  return problems


@pytest.fixture(scope='module')
def results():
  forms = _forms()
  r = subprocess.run(
    [sys.executable, '-c', _PROBE, json.dumps([[f, t] for f, t, _, _ in forms]), UNKNOWN],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'NEOBERT_DEBUG': '0'},
  )
  assert r.returncode == 0, r.stderr[-3000:]
  runs = json.loads(r.stdout.strip().splitlines()[-1])
  assert len(runs) == 2 * len(forms)
  return [(form, run) for form, pair in zip(forms, zip(runs[::2], runs[1::2])) for run in pair]


def test_help_and_unknown_flag_in_every_form(results):
  failed = []
  for (form, target, module, name), run in results:
    prog, _, has_config = COMMANDS[module]
    if run['flag'] == '--help':
      problems = (
        ([] if run['code'] == 0 else [f'exit status {run["code"]}'])
        + ([f'stderr: {run["err"][-300:]}'] if run['err'].strip() else [])
        + _help_problems(run['out'], name, has_config)
      )
    else:
      problems = _error_problems(run['code'], run['err'], prog)
    if problems:
      failed.append(f'{form} {target} {run["flag"]}: {"; ".join(problems)}\n{run["out"][:600]}{run["err"][-600:]}')
  assert not failed, '\n\n'.join(failed)


def test_python_dash_m_in_a_fresh_interpreter():
  # The one form runpy stands in for above, run for real once, on an absl command: its --help must exit 0 in a
  # fresh interpreter too.
  r = subprocess.run(
    [sys.executable, '-m', 'neobert_jax.finetune', '--help'], cwd=REPO, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0 and not _help_problems(r.stdout, 'python -m neobert_jax.finetune', True), r.stdout + r.stderr
