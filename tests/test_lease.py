"""One writer per run (neobert_jax/lease.py): a second job on a live workdir or prepare output is refused with one
line naming the holder, before it reads or writes anything there; a stale lease is taken over with a warning; a
restarted job (same SLURM job id, JobSet or run_id) takes its own lease back at once; a clean exit releases it and
kill -9 leaves it to expire; read-only commands work beside a live run. Local directories and the real GCS server
(tests/gcs_emulator.py, which honours generation preconditions as GCS does)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from etils import epath

from neobert_jax import errors, lease
from neobert_jax.weights import runs
from tests.support.tiny_train import SUPPORT_ON_PATH

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=['local', pytest.param('bucket', marks=pytest.mark.server)])
def where(request, tmp_path):
  """A directory for a run: local, or on the GCS emulator."""
  if request.param == 'local':
    return str(tmp_path / 'run')
  gcs = request.getfixturevalue('gcs')
  return f'{gcs}/lease/{request.node.originalname}-{time.time_ns()}'


def _content(directory: str) -> dict:
  return json.loads((epath.Path(directory) / lease.LEASE_FILE).read_text())


def test_second_holder_refused_stale_taken_over_lost_detected_and_released(where, caplog):
  first = lease.acquire(where, '--workdir', timeout=1.0)
  held = _content(where)
  assert {'host', 'pid', 'job', 'restart', 'run_id', 'started', 'heartbeat', 'timeout_s'} <= set(held)
  with pytest.raises(errors.InUseError) as refused:
    lease.acquire(where, '--workdir', timeout=1.0)
  line = str(refused.value)
  assert '\n' not in line and f'pid {os.getpid()}' in line and 'last heartbeat' in line and 'started' in line
  assert refused.value.exit_status == 15 and 'another --workdir' in line
  time.sleep(0.6)  # the heartbeat renews every timeout/4
  assert _content(where)['heartbeat'] > held['heartbeat']

  first._stop.set()  # the holder freezes: no more heartbeats (a stopped VM, a hung process)
  first._thread.join()
  with pytest.raises(errors.InUseError):
    lease.acquire(where, '--workdir', timeout=1.0)  # not stale yet
  time.sleep(1.3)
  caplog.set_level(logging.WARNING)
  second = lease.acquire(where, '--workdir', timeout=30.0)
  assert (
    'took over the lease' in caplog.text and f'pid {os.getpid()}' in caplog.text and 'stopped renewing' in caplog.text
  )
  first._stop.clear()
  first.renew()  # it wakes up: its next heartbeat finds the lease taken over
  assert first.lost and 'taken over' in first.lost
  with pytest.raises(errors.InUseError, match='stopped without writing'):
    first.check()
  first.release()  # gives up nothing that is not its own
  assert _content(where)['token'] == second.holder.token
  second.release()
  assert not (epath.Path(where) / lease.LEASE_FILE).exists()


def test_a_restarted_job_takes_its_own_lease_back_and_a_straggler_is_refused(where, monkeypatch, caplog):
  caplog.set_level(logging.WARNING)
  monkeypatch.setenv('SLURM_JOB_ID', '4242')
  monkeypatch.setenv('SLURM_RESTART_COUNT', '0')
  first = lease.acquire(where, '--workdir', timeout=600)
  first._stop.set()  # requeued: the first incarnation is presumed gone, its lease still fresh
  monkeypatch.setenv('SLURM_RESTART_COUNT', '1')
  second = lease.acquire(where, '--workdir', timeout=600)
  assert 'the same job (slurm job 4242) restarted' in caplog.text
  monkeypatch.setenv('SLURM_RESTART_COUNT', '0')  # the first incarnation, still running, tries again
  with pytest.raises(errors.InUseError, match='a later restart of this job'):
    lease.acquire(where, '--workdir', timeout=600)
  monkeypatch.delenv('SLURM_JOB_ID')
  with pytest.raises(errors.InUseError, match='another job'):
    lease.acquire(where, '--workdir', run_id='mine', timeout=600)
  second.release()
  third = lease.acquire(where, '--workdir', run_id='mine', timeout=600)
  third._stop.set()  # killed without a clean exit
  fourth = lease.acquire(where, '--workdir', run_id='mine', timeout=600)  # an explicit run_id restarted
  assert 'the same job (run_id mine) restarted' in caplog.text
  fourth.release()


_HOLD = """
import sys, time
from neobert_jax import lease
if len(sys.argv) > 3:  # a job on another machine: its pid cannot be checked from here
  lease.socket.gethostname = lambda: sys.argv[3]
lease.acquire(sys.argv[1], '--output', timeout=float(sys.argv[2]))
print('READY', flush=True)
time.sleep(600)
"""


def _holder(directory: str, timeout: float, host: str = '') -> subprocess.Popen:
  child = subprocess.Popen(
    [sys.executable, '-c', _HOLD, directory, str(timeout), *([host] if host else [])],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  assert child.stdout.readline().strip() == 'READY'
  return child


def test_kill_9_leaves_the_lease_to_expire(tmp_path, caplog):
  """A holder on another host: its lease outlives it until the timeout. On this host: its pid is gone, so the same
  command again takes the lease at once."""
  caplog.set_level(logging.WARNING)
  out = str(tmp_path / 'out')
  child = _holder(out, 1.5, host='elsewhere')
  child.send_signal(signal.SIGKILL)
  child.wait(timeout=30)
  assert _content(out)['pid'] == child.pid  # nothing released it
  with pytest.raises(errors.InUseError, match=f'host elsewhere, pid {child.pid}'):
    lease.acquire(out, '--output')
  time.sleep(1.6)
  lease.acquire(out, '--output').release()
  assert f'pid {child.pid}' in caplog.text and 'stopped renewing' in caplog.text
  child = _holder(out, 600)
  child.send_signal(signal.SIGKILL)
  child.wait(timeout=30)
  lease.acquire(out, '--output').release()
  assert f'its process {child.pid} on this host is gone' in caplog.text


@pytest.mark.parametrize('engine', ['local', 'ray'])
def test_two_prepare_builds_into_one_output_are_refused(tmp_path, engine, capsys):
  """A live build (a process holding the output's lease) and a second one into the same output, both engines: one
  line naming the holder, exit 15, nothing written. The Ray engine refuses before it joins a cluster."""
  from tests.support import synthetic_data
  from neobert_jax.data.prepare import local

  (tmp_path / 'in.txt').write_text('the cat sat\nthe dog ran\n')
  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), ('the', 'cat', 'sat', 'dog', 'ran'))
  out = tmp_path / 'out'
  child = _holder(str(out), 60)
  try:
    argv = ['--input', str(tmp_path / 'in.txt'), '--output', str(out), '--tokenizer', vocab, '--workers', '0']
    argv += ['--engine', engine, '--ray-address', '127.0.0.1:1', '--no-progress']
    with pytest.raises(SystemExit) as stop:
      local.main(argv)
    assert stop.value.code == errors.InUseError.exit_status
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith('prepare: in use: --output=') and f'pid {child.pid}' in err[0], err
    assert sorted(p.name for p in out.iterdir()) == [lease.LEASE_FILE]
  finally:
    child.kill()
    child.wait()


def test_finetune_on_a_live_workdir_is_refused_before_its_config_is_read(tmp_path):
  from neobert_jax.config.finetune import base_config
  from neobert_jax.jobs import finetune as finetune_job

  workdir = tmp_path / 'cls'
  child = _holder(str(workdir), 60)
  try:
    cfg = base_config('classification')  # no train file: any check of it would fail with another error
    with pytest.raises(errors.InUseError, match=f'--workdir={workdir} is in use by another job: .*pid {child.pid}'):
      finetune_job.finetune(cfg, workdir)
    assert sorted(p.name for p in workdir.iterdir()) == [lease.LEASE_FILE]
  finally:
    child.kill()
    child.wait()


_BAD_FLAGS = [
  (['--eval-fraction', '2'], '--eval-fraction=2.0'),
  (['--eval-fraction', '-0.1'], '--eval-fraction=-0.1'),
  (['--eval-fraction', 'nan'], '--eval-fraction=nan'),
  (['--max-length', '2'], '--max-length=2'),
  (['--shard-mb', '0'], '--shard-mb=0.0'),
  (['--shard-mb', 'inf'], '--shard-mb=inf'),
  (['--workers', '-1'], '--workers=-1'),
  (['--workers', '100000'], '--workers=100000'),
  (['--split-mb', '-5'], '--split-mb=-5.0'),
  (['--text-field', ''], '--text-field is empty'),
  (['--max-length', 'ten'], '--max-length'),
  (['--engine', 'spark'], '--engine'),
  (['--text-mode', 'word'], '--text-mode'),
]


def test_every_out_of_range_prepare_flag_is_one_line(tmp_path, capsys):
  from neobert_jax.data.prepare import local

  (tmp_path / 'in.txt').write_text('the cat sat\n')
  out = tmp_path / 'out'
  for flags, named in _BAD_FLAGS:
    with pytest.raises(SystemExit) as stop:
      local.main(['--input', str(tmp_path / 'in.txt'), '--output', str(out), '--no-progress', *flags])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert stop.value.code == errors.ConfigError.exit_status, (flags, err)
    assert len(err) == 1 and 'config error' in err[0] and named in err[0] and 'Traceback' not in err[0], (flags, err)
    assert not out.exists(), flags  # nothing written


# --- two trainers on one workdir, and read-only commands beside a live run -------------------------------------------

_TRAIN = """
import os, sys, time
from neobert_jax.jobs import pretrain as pretrain_job
from tests.support.tiny_train import tiny_config
def hold(step):
  if step == 4:  # checkpoint 3 is written; the parent works beside this live run, then stops it
    print('READY', flush=True)
    while not os.path.exists(sys.argv[3]):  # until the parent has sent its signal
      time.sleep(0.1)
cfg = tiny_config(steps=6)
cfg.run_id = 'job-a'
cfg.data.dir = sys.argv[2] or cfg.data.dir
pretrain_job.pretrain(cfg, sys.argv[1], on_step=hold)
"""


def _live_trainer(workdir: str, data_dir: str, tmp_path: Path) -> subprocess.Popen:
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  child = subprocess.Popen(
    [sys.executable, '-c', SUPPORT_ON_PATH + _TRAIN, workdir, data_dir, str(tmp_path / 'go')],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    text=True,
  )
  deadline, line = time.time() + 300, ''
  while 'READY' not in line and time.time() < deadline and child.poll() is None:
    line = child.stdout.readline()
  assert 'READY' in line, f'the trainer did not reach step 4 (exit {child.poll()})'
  deadline = time.time() + 60  # the async save of step 3 may still be finishing
  while runs.latest_step(workdir) != 3 and time.time() < deadline:
    time.sleep(0.2)
  return child


def _files(root: epath.Path) -> dict[str, bytes]:
  out = {}
  for p in root.iterdir():
    if p.is_dir():
      out.update({f'{p.name}/{k}': v for k, v in _files(p).items()})
    elif p.name != lease.LEASE_FILE:
      out[p.name] = p.read_bytes()
  return out


@pytest.mark.slow
def test_second_trainer_on_a_live_workdir_is_refused_and_readers_work_beside_it(where, tmp_path, capsys, caplog):
  """A live trainer (a child, paused after checkpoint 3) and a second `train` on its workdir: one line naming the
  holder, exit 15, every file of the workdir as it was. Beside it, read-only commands take no lease: the HF export
  (convert) and the parameter reader of embed / evaluate. Locally the live run is then stopped with SIGTERM (a clean
  exit: the lease is released); on the bucket it is killed with kill -9 and a restart with the same run_id takes
  the lease back at once and finishes the run."""
  from neobert_jax import paths
  from neobert_jax.jobs import pretrain as pretrain_job
  from neobert_jax.convert import export_hf
  from neobert_jax.data import pipeline
  from tests.support.tiny_train import tiny_config, train_only

  cfg = tiny_config(steps=6)
  data_dir = ''
  if where.startswith('gs://'):
    local_data, _ = pipeline.open_prepared(cfg.data, int(cfg.model.max_length), int(cfg.model.vocab_size))
    data_dir = f'{where}-data'
    paths.publish_dir(local_data, epath.Path(data_dir), 'manifest.json')
    cfg.data.dir = data_dir
  child = _live_trainer(where, data_dir, tmp_path)
  try:
    before = _files(epath.Path(where))
    with pytest.raises(SystemExit) as stop, errors.reported('train'):
      pretrain_job.pretrain(tiny_config(steps=6), where)
    assert stop.value.code == errors.InUseError.exit_status
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and f'pid {child.pid}' in err[0] and 'run_id job-a' in err[0], err
    assert 'last heartbeat' in err[0] and 'started' in err[0]
    assert _files(epath.Path(where)) == before  # nothing read into the run, nothing written

    exported = export_hf.export_checkpoint(where, tmp_path / 'hf')  # convert, beside the live run
    assert (Path(exported) / 'config.json').is_file()
    model_cfg, params = runs.restore_params(where)  # what embed and evaluate read
    assert params and model_cfg.hidden_size == 32
    if not where.startswith('gs://'):
      child.send_signal(signal.SIGTERM)
      (tmp_path / 'go').touch()
      assert child.wait(timeout=120) == 0
      assert not (epath.Path(where) / lease.LEASE_FILE).exists()  # a clean exit released it
      return
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert _content(where)['pid'] == child.pid  # left to expire
    caplog.set_level(logging.WARNING)
    cfg.run_id = 'job-a'  # the same job restarted: no wait for the timeout
    assert (
      train_only(cfg, where).final_step == 6
    )  # (the report of pretrain_job.pretrain reads held-out data locally only)
    assert 'the same job (run_id job-a) restarted' in caplog.text
    assert not (epath.Path(where) / lease.LEASE_FILE).exists()
  finally:
    if child.poll() is None:
      child.kill()
