"""Resuming a training run: exact resume (data position included), a corrupt or half-written latest step, a lost
data position, other meshes, init sources, NaN, SIGTERM. The checkpoint protocol on its own is
tests/test_engine_checkpoint.py's."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import COMPILE_FLAGS

from neobert_jax.weights import runs
from neobert_jax import errors
from tests.support.tiny_train import assert_identical_params, finished_tiny_run, tiny_config, train_only

REPO = Path(__file__).resolve().parents[1]


class Crash(Exception):
  pass


def _crash_after(k):
  def hook(step):
    if step == k:
      raise Crash(f'simulated crash after step {k}')

  return hook


def _params(workdir):
  return runs.restore_params(workdir)[1]


_assert_identical = assert_identical_params


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('full')
  assert finished_tiny_run(workdir, steps=6) == 6
  return workdir


@pytest.mark.slow
def test_crash_and_resume_is_bit_identical(uninterrupted, tmp_path):
  cfg = tiny_config(steps=6)
  with pytest.raises(Crash):
    train_only(cfg, tmp_path, on_step=_crash_after(4))  # checkpoint at 3, crash after 4: step 4 is lost
  assert runs.latest_step(tmp_path) == 3
  result = train_only(cfg, tmp_path)  # the same command again
  assert result.final_step == 6
  _assert_identical(_params(tmp_path), _params(uninterrupted))
  cfg_json = json.loads((tmp_path / 'config.json').read_text())
  assert cfg_json['model']['hidden_size'] == 32 and cfg_json['mesh']['fsdp'] == 8  # resolved config written
  lines = [json.loads(x) for x in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert {'train/loss', 'train/learning_rate', 'train/tokens_per_sec', 'train/mfu'} <= set(lines[-1])


def test_corrupt_latest_falls_back_and_half_written_is_ignored(uninterrupted, tmp_path, caplog):
  shutil.copytree(uninterrupted, tmp_path, dirs_exist_ok=True)
  cdir = tmp_path / 'checkpoints'
  # A crash mid-save leaves only Orbax's temporary directory: never listed as a checkpoint.
  (cdir / '9.orbax-checkpoint-tmp-123' / 'params').mkdir(parents=True)
  assert runs.latest_step(tmp_path) == 6
  # Damage the latest complete step: truncated index, array data gone.
  (cdir / '6' / 'params' / 'manifest.ocdbt').write_bytes(b'')
  for sub in ('d', 'ocdbt.process_0'):
    shutil.rmtree(cdir / '6' / 'params' / sub, ignore_errors=True)
  caplog.set_level('WARNING')
  result = train_only(tiny_config(steps=6), tmp_path)
  assert 'checkpoint step 6' in caplog.text and 'falling back to step 3' in caplog.text
  assert result.final_step == 6
  assert (cdir / '6.corrupt').is_dir()  # kept for inspection, out of the way
  _assert_identical(_params(tmp_path), _params(uninterrupted))  # steps 4-6 replayed exactly


def test_unusable_data_state_keeps_the_checkpoint(uninterrupted, tmp_path, caplog):
  """Only the data-iterator state is lost: resume at the same step with a warning, never set the step aside."""
  shutil.copytree(uninterrupted, tmp_path, dirs_exist_ok=True)
  (tmp_path / 'checkpoints' / '6' / 'data' / 'process_0-of-1.json').unlink()
  caplog.set_level('INFO')
  assert train_only(tiny_config(steps=6), tmp_path).final_step == 6
  assert f'resumed from {tmp_path / "checkpoints"}/6' in caplog.text
  assert 'data order is NOT the same' in caplog.text
  assert not list((tmp_path / 'checkpoints').glob('*.corrupt*'))


@pytest.mark.slow
def test_restore_onto_a_different_mesh(uninterrupted, tmp_path):
  cfg = tiny_config(steps=6)
  with pytest.raises(Crash):
    train_only(cfg, tmp_path, on_step=_crash_after(3))
  other = tiny_config(steps=6)
  other.mesh.data, other.mesh.fsdp, other.mesh.tensor = 2, 2, 2
  assert train_only(other, tmp_path).final_step == 6
  a, b = _params(tmp_path), _params(uninterrupted)
  for k in a:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=2e-5, err_msg=k)


@pytest.mark.slow
def test_init_from_checkpoint_params_only(uninterrupted, tmp_path):
  cfg = tiny_config(steps=1)
  cfg.init.from_checkpoint = str(uninterrupted)
  cfg.optimizer.warmup_steps = 1  # step 0 of a fresh schedule has lr 0: parameters stay exactly as loaded
  train_only(cfg, tmp_path)
  _assert_identical(_params(tmp_path), _params(uninterrupted))


@pytest.mark.slow
def test_init_from_hf_params_only(uninterrupted, tmp_path):
  # init.from_hf reads the Hugging Face layout through the weights layer (not convert/); here the directory is
  # the converter's export of the uninterrupted run, so the loaded parameters are exactly that run's.
  from neobert_jax.convert import export_hf  # pylint: disable=g-import-not-at-top

  model_cfg, flat = runs.restore_params(uninterrupted)
  export_hf.export_flat(flat, model_cfg, tmp_path / 'hf')
  cfg = tiny_config(steps=1)
  cfg.init.from_hf = str(tmp_path / 'hf')
  cfg.optimizer.warmup_steps = 1  # lr 0 at step 0: parameters stay exactly as loaded
  train_only(cfg, tmp_path / 'run')
  _assert_identical(_params(tmp_path / 'run'), flat)


@pytest.mark.slow
def test_nan_stops_with_last_good_checkpoint(tmp_path):
  cfg = tiny_config(steps=4)
  # Step 1 runs at lr 0 (warmup start) and is checkpointed; step 2's update (lr 5e29) overflows the parameters.
  cfg.optimizer.peak_lr, cfg.optimizer.warmup_steps, cfg.optimizer.clip_norm = 1e30, 2, 0.0
  cfg.checkpoint.every_steps = 1
  with pytest.raises(errors.TrainingDiverged, match='Last good checkpoint: .*checkpoints/1'):
    train_only(cfg, tmp_path)
  cfg.train.nan_policy = 'skip'
  shutil.rmtree(tmp_path)
  result = train_only(cfg, tmp_path)
  assert result.final_step == 4 and result.skipped_steps >= 1
  assert all(np.isfinite(v).all() for v in _params(tmp_path).values())


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(tmp_path):
  """The real CLI in a subprocess: SIGTERM mid-training -> checkpoint + exit 0; the same command resumes."""
  workdir = tmp_path / 'run'
  cmd = [
    sys.executable,
    '-m',
    'neobert_jax.train',
    '--config=configs/tiny_cpu.py',
    f'--workdir={workdir}',
    '--config.model.hidden_size=32',
    '--config.model.num_layers=1',
    '--config.model.num_heads=2',
    '--config.model.intermediate_size=64',
    '--config.train.global_batch_size=8',
    '--config.eval.every_steps=0',
    '--config.eval.at_start=False',
    '--config.eval.probe_task=',  # the probe is the main job's (tests/test_train_probe.py), not what is tested here
    '--config.checkpoint.every_steps=1000',
    '--config.logging.progress_bar=False',
    '--config.logging.peak_flops_per_device=1e11',
    '--config.logging.log_every=1',
    '--config.optimizer.warmup_steps=1',
    '--config.optimizer.warmup_fraction=0',
    # A rate table that does not depend on train.num_steps (tiny_cpu's linear decay has one entry per step): the
    # resume below, with another num_steps, reads the first job's compiled step back from the compilation cache.
    '--config.optimizer.schedule=constant',
  ]
  env = {**os.environ, 'PYTHONPATH': str(REPO), 'XLA_FLAGS': COMPILE_FLAGS}
  proc = subprocess.Popen(
    cmd + ['--config.train.num_steps=100000'],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  metrics = workdir / 'metrics.jsonl'
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
      break
    time.sleep(0.5)
  assert proc.poll() is None, proc.communicate()[0][-3000:]
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate(timeout=120)[0]
  assert proc.returncode == 0, out[-3000:]
  assert 'preempted (SIGTERM), resumable' in out
  saved = runs.latest_step(workdir)
  assert saved is not None and saved >= 2
  resumed = subprocess.run(
    cmd + [f'--config.train.num_steps={saved + 1}'], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
  )
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
  assert f'resumed from {workdir / "checkpoints"}/{saved}' in resumed.stdout + resumed.stderr
  assert runs.latest_step(workdir) == saved + 1
