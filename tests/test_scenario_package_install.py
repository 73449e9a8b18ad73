"""`pip install .` into a fresh venv; the console scripts run from outside the checkout, train.py from inside.

The venv inherits this environment's packages through a .pth line (reinstalling jax and torch would take minutes)
and the package is built from a copy of the source (so no build/ or *.egg-info lands in the checkout), with
--no-deps --no-build-isolation --no-index: nothing is downloaded. What it proves: pyproject.toml builds, the wheel
holds every module and the Hugging Face model file, the entry points resolve, and nothing needs the repository on
sys.path (recipes passed by path included).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = (
  'neobert-train',
  'neobert-prepare',
  'neobert-convert',
  'neobert-compile',
  'neobert-finetune',
  'neobert-evaluate',
  'neobert-embed',
)


def _run(cmd, cwd, env=None, timeout=180):
  return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('install')
  src = tmp / 'src'
  src.mkdir()
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(REPO / name, src / name)
  shutil.copytree(REPO / 'neobert_jax', src / 'neobert_jax', ignore=shutil.ignore_patterns('__pycache__'))
  env_dir = tmp / 'venv'
  venv.create(env_dir, with_pip=False)
  py = env_dir / 'bin' / 'python'
  purelib = Path(_run([py, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'], tmp).stdout.strip())
  # This environment's packages, after the venv's own (so the venv's neobert_jax wins over any editable install).
  (purelib / '_parent_env.pth').write_text('\n'.join(site.getsitepackages()) + '\n')
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
  env['PATH'] = f'{env_dir / "bin"}{os.pathsep}{env.get("PATH", "")}'
  r = _run(
    [py, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation', '--no-index', src], tmp, env, timeout=300
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return env_dir, env, tmp


def test_installed_package_is_complete(installed):
  env_dir, env, tmp = installed
  code = (
    'import pathlib, neobert_jax, neobert_jax.convert.hf_modeling as m; '
    'print(neobert_jax.__file__); print(m.MODELING_FILE.is_file())'
  )
  r = _run([env_dir / 'bin' / 'python', '-c', code], tmp, env)
  assert r.returncode == 0, r.stderr[-3000:]
  where, has_model_file = r.stdout.split()
  assert str(env_dir) in where and has_model_file == 'True'


@pytest.mark.parametrize('script', SCRIPTS)
def test_console_script_help_outside_the_repo(installed, script):
  env_dir, env, tmp = installed
  r = _run([env_dir / 'bin' / script, '--help'], tmp, env)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert r.stdout.startswith(f'usage: {script} '), r.stdout[-2000:]  # the layout: tests/test_cli_convention.py
  assert 'Traceback' not in r.stderr, r.stderr[-3000:]


def test_recipe_by_path_outside_the_repo(installed):
  # The stage-2 recipe loads stage 1's by path; a mesh that cannot fit 1 device is refused after loading both.
  env_dir, env, tmp = installed
  r = _run(
    [
      env_dir / 'bin' / 'neobert-train',
      f'--config={REPO / "configs" / "neobert_250m_4096.py"}',
      f'--workdir={tmp / "run"}',
      '--config.mesh.tensor=3',
    ],
    tmp,
    env,
  )
  assert r.returncode == 2 and 'tensor' in r.stderr, r.stderr[-3000:]
  assert r.stderr.strip().count('\n') == 0 and 'Traceback' not in r.stderr, r.stderr[-3000:]


def test_train_py_help_from_the_repo_root():
  r = _run([sys.executable, 'train.py', '--help'], REPO)
  assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr[-3000:]
  assert '--config' in r.stdout and '--workdir' in r.stdout
