"""Runs on a bucket: a real GCS server on 127.0.0.1 (gcp-storage-emulator, started by tests/conftest.py).

The workdir (checkpoints written straight to the bucket by Orbax, config.json, history, metrics, TensorBoard) on
gs://; a run killed with kill -9 resumes from the bucket bit-identical to an uninterrupted run; a bucket that does
not exist or refuses writes, and an s3:// URL, are one line before any work, with nothing lost."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from etils import epath

from neobert_jax import errors
from neobert_jax.weights import runs
from tests.support.tiny_train import (
  SUPPORT_ON_PATH,
  assert_identical_params,
  finished_tiny_run,
  run_history,
  tiny_config,
  train_only,
)

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[1]


_assert_identical = assert_identical_params


@pytest.fixture(scope='module')
def local_run(tmp_path_factory):
  """The tiny run on local disk, uninterrupted: the reference of the kill -9 test and the export test's source."""
  workdir = tmp_path_factory.mktemp('local')
  finished_tiny_run(workdir, steps=6)
  return workdir


@pytest.fixture(scope='module')
def uninterrupted(local_run):
  return runs.restore_params(local_run)[1]


_CHILD = """
import os, sys, time
from tests.support.tiny_train import assert_identical_params, tiny_config, train_only
def hold(step):
  if step == 4:  # checkpoint 3 is on the bucket; step 4 is lost when the parent kills us here
    print('READY', flush=True)
    time.sleep(600)
cfg = tiny_config(steps=6)
cfg.data.dir = sys.argv[2]
train_only(cfg, sys.argv[1], on_step=hold)
"""


def test_run_on_a_bucket_killed_and_resumed_is_bit_identical(gcs, uninterrupted, tmp_path):
  """The workdir and the prepared data on the bucket: kill -9 mid-run, resume, bit-identical to a local run."""
  from neobert_jax import paths
  from neobert_jax.data import pipeline

  cfg = tiny_config(steps=6)
  local_data, _ = pipeline.open_prepared(cfg.data, int(cfg.model.max_length), int(cfg.model.vocab_size))
  data_url = f'{gcs}/data/tiny'
  paths.publish_dir(local_data, epath.Path(data_url), 'manifest.json')
  cfg.data.dir = data_url
  workdir = f'{gcs}/runs/killed'
  env = {
    **os.environ,
    'NEOBERT_JAX_CACHE': str(tmp_path / 'child-cache'),
    'JAX_PLATFORMS': 'cpu',
  }
  env['NEOBERT_JAX_CACHE'] = os.environ.get('NEOBERT_JAX_CACHE', env['NEOBERT_JAX_CACHE'])
  child = subprocess.Popen(
    [sys.executable, '-c', SUPPORT_ON_PATH + _CHILD, workdir, data_url],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.time() + 300
    line = ''
    while 'READY' not in line and time.time() < deadline and child.poll() is None:
      line = child.stdout.readline()
    assert 'READY' in line, child.stderr.read()
    deadline = time.time() + 60  # the async save of step 3 may still be finishing
    while runs.latest_step(workdir) != 3 and time.time() < deadline:
      time.sleep(0.2)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
  finally:
    if child.poll() is None:
      child.kill()
  assert runs.latest_step(workdir) == 3
  cfg.logging.tensorboard = True  # a free change on resume: the events go up through the metrics mirror
  result = train_only(cfg, workdir)  # the same command again, in another process
  assert result.final_step == 6
  _assert_identical(runs.restore_params(workdir)[1], uninterrupted)
  root = epath.Path(workdir)
  assert json.loads((root / 'config.json').read_text())['train']['num_steps'] == 6
  assert [e['event'] for e in run_history(workdir)] == ['start', 'resume']
  steps = [json.loads(x)['step'] for x in (root / 'metrics.jsonl').read_text().splitlines()]
  assert steps[-1] == 6 and 1 in steps  # the resumed run appended to the killed run's metrics
  assert any(p.name.startswith('events.out.tfevents') for p in (root / 'tensorboard').iterdir())


def test_missing_bucket_is_one_line_before_any_work(gcs, capsys):
  with pytest.raises(SystemExit) as stop, errors.reported('train'):
    train_only(tiny_config(steps=2), 'gs://no-such-bucket/run')
  assert stop.value.code == errors.StorageError.exit_status
  err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
  assert len(err) == 1 and 'gs://no-such-bucket/run' in err[0] and 'bucket exists' in err[0], err


def test_s3_is_refused_with_one_line_and_no_local_folder(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(errors.ConfigError, match='s3://'):
    train_only(tiny_config(steps=2), 's3://bucket/run')
  assert not list(tmp_path.iterdir())  # never a local folder named 's3:'


def test_export_to_a_bucket_loads_in_transformers_and_starts_a_run(gcs, local_run, tmp_path):
  """The export is uploaded with config.json last; read back from the bucket it is byte-identical to a local
  export of the same checkpoint, loads in transformers, and initialises another run (init.from_hf on gs://)."""
  from neobert_jax import paths
  from neobert_jax.convert import export_hf

  source = local_run  # only read: the export and the run it starts write elsewhere
  url = f'{gcs}/exports/tiny'
  export_hf.export_checkpoint(source, url)
  local = export_hf.export_checkpoint(source, tmp_path / 'local-export')
  with pytest.raises(errors.ExportError, match='--overwrite'):
    export_hf.export_checkpoint(source, url)  # an existing export on the bucket is kept
  copy = paths.local_copy(url, marker='config.json')
  assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in Path(local).iterdir())
  assert 'README.md' in {p.name for p in copy.iterdir()}  # the model card, uploaded with the rest
  for p in Path(local).iterdir():
    assert (copy / p.name).read_bytes() == p.read_bytes(), p.name
  from transformers import AutoModelForMaskedLM

  AutoModelForMaskedLM.from_pretrained(copy, trust_remote_code=True)
  # convert's two directions between buckets: HF dir -> flat params file -> HF dir, the same weights
  from neobert_jax.jobs import convert as convert_job

  convert_job.from_pytorch(url, f'{gcs}/flat/tiny.safetensors')
  convert_job.to_pytorch(f'{gcs}/flat/tiny.safetensors', f'{gcs}/exports/back')
  back = paths.local_copy(f'{gcs}/exports/back', marker='config.json')
  assert (back / 'model.safetensors').read_bytes() == (copy / 'model.safetensors').read_bytes()
  cfg = tiny_config(steps=1)
  cfg.init.from_hf, cfg.optimizer.warmup_steps = url, 1  # lr 0 at step 0: the parameters stay as loaded
  train_only(cfg, tmp_path / 'from-hf')
  _assert_identical(runs.restore_params(tmp_path / 'from-hf')[1], runs.restore_params(source)[1])


def test_bucket_that_refuses_writes_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
  """A second GCS server whose storage turns read-only after an object was put there: the run stops with one line
  naming the URL before any work, and the object is still there. (The emulator has no IAM to answer 403; its
  read-only disk makes every write fail on the server side, which is retried for the bucket's retry window,
  neobert_jax/bucket.py; the retries still reach the server, within a window of 2 s here.)"""
  import gcsfs

  monkeypatch.setenv('NEOBERT_BUCKET_RETRY_SECONDS', '2')
  from conftest import gcs_env, start_gcs_emulator

  disk = tmp_path / 'disk'
  disk.mkdir()
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=8m', 'tmpfs', str(disk)], capture_output=True).returncode:
    pytest.skip('cannot mount a tmpfs here (needs root): no read-only storage for the server')
  proc, url = start_gcs_emulator(data_dir=disk, bucket='locked')
  saved = {k: os.environ.get(k) for k in gcs_env(url)}
  try:
    os.environ.update(gcs_env(url))
    gcsfs.GCSFileSystem.clear_instance_cache()  # epath's gs:// filesystem was made for the session's server
    epath.Path('gs://locked/keep.txt').write_text('precious')
    subprocess.run(['mount', '-o', 'remount,ro', str(disk)], check=True)
    with pytest.raises(SystemExit) as stop, errors.reported('train'):
      train_only(tiny_config(steps=2), 'gs://locked/run')
    assert stop.value.code == errors.StorageError.exit_status
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and 'gs://locked/run cannot be written' in err[0], err
    assert epath.Path('gs://locked/keep.txt').read_text() == 'precious'
  finally:
    for k, v in saved.items():
      os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    gcsfs.GCSFileSystem.clear_instance_cache()
    proc.terminate()
    proc.wait(timeout=10)
    subprocess.run(['umount', str(disk)], capture_output=True)
