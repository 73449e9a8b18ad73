"""engine/metrics.py: MFU that stays honest whatever the load at start-up, and the wandb sink honouring wandb's own
environment (WANDB_DIR, WANDB_PROJECT, WANDB_MODE). Its one-line refusals (no key, a bad mode) are cases of
tests/test_cli_errors.py."""

import importlib.util
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from neobert_jax.engine import metrics
from tests.support.tiny_train import tiny_config, train_only

WANDB = importlib.util.find_spec('wandb') is not None


def test_a_peak_measured_under_load_never_shows_mfu_above_one(tmp_path):
  """A start-up peak far below the device's (1 FLOP/s: a matmul timed while something else held the cores): the
  logged MFU stays at or below 100%, because the rate the run achieves raises the peak."""
  cfg = tiny_config(steps=4)
  cfg.logging.peak_flops_per_device = 1.0
  train_only(cfg, tmp_path / 'run')
  lines = [json.loads(x) for x in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  mfu = [r['train/mfu'] for r in lines if 'train/mfu' in r]
  assert mfu and all(0 < m <= 1.0 for m in mfu) and mfu[0] == 1.0, mfu


def test_the_cpu_peak_is_the_best_measured_on_this_cpu(tmp_path, monkeypatch):
  monkeypatch.setenv('NEOBERT_JAX_CACHE', str(tmp_path))
  first = metrics.cpu_matmul_peak(jnp.float32)
  cache = tmp_path / 'hardware' / 'cpu_matmul_peak.json'
  (key,) = json.loads(cache.read_text())
  assert 'cores | float32' in key
  cache.write_text(json.dumps({key: first * 1000}))  # a quiet start measured far more than this one can
  assert metrics.cpu_matmul_peak(jnp.float32) == first * 1000


def test_wandb_settings_come_from_the_config_then_the_environment(monkeypatch):
  monkeypatch.setenv('WANDB_PROJECT', 'from-env')
  monkeypatch.setenv('WANDB_MODE', 'offline')
  env = metrics.Wandb.from_settings('', 'n', 'a, b', '', {})
  assert (env.project, env.mode, env.tags) == ('from-env', 'offline', ('a', 'b'))
  cfg = metrics.Wandb.from_settings('mine', '', '', 'disabled', {})
  assert (cfg.project, cfg.mode) == ('mine', 'disabled')
  monkeypatch.delenv('WANDB_PROJECT')
  monkeypatch.delenv('WANDB_MODE')
  assert metrics.Wandb.from_settings('', '', '', '', {}).project == metrics.DEFAULT_WANDB_PROJECT


_WANDB_DIR_CHILD = """
import sys
from neobert_jax.engine import metrics
writer = metrics.MetricsWriter(sys.argv[1], False, metrics.Wandb.from_settings('', '', '', 'offline', {}))
writer.write(1, {'loss': 1.0})
assert writer._wandb.project == 'from-env', writer._wandb.project
writer.close()
"""


@pytest.mark.skipif(not WANDB, reason='wandb is not installed (pip install -e .[wandb])')
def test_wandb_dir_keeps_the_offline_run_outside_the_workdir(tmp_path):
  # A process of its own: wandb keeps its settings per process, so an earlier wandb run in this worker would win.
  (tmp_path / 'elsewhere').mkdir()
  env = {**os.environ, 'WANDB_DIR': str(tmp_path / 'elsewhere'), 'WANDB_PROJECT': 'from-env', 'JAX_PLATFORMS': 'cpu'}
  env.pop('WANDB_MODE', None)
  out = subprocess.run(
    [sys.executable, '-c', _WANDB_DIR_CHILD, str(tmp_path / 'run')], env=env, capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert list((tmp_path / 'elsewhere').rglob('run-*.wandb')), sorted(str(p) for p in tmp_path.rglob('*'))[:40]
  assert sorted(p.name for p in (tmp_path / 'run' / 'wandb').iterdir()) == ['run_id']  # the resume id stays
