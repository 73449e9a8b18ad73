"""launch/local.py + neobert_jax.distributed: a 2-process CPU job agrees on a psum, and dies cleanly."""

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'launch'))
import local as launcher  # noqa: E402  (launch/ is a folder of scripts, not a package)

PSUM = os.path.join(ROOT, 'launch', 'examples', 'psum_check.py')
HEARTBEAT_S = 5


def _launch(args, timeout=120):
  cmd = [sys.executable, os.path.join(ROOT, 'launch', 'local.py')] + args
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.multiprocess
def test_two_processes_agree_on_psum():
  r = _launch(['-n', '2', '--devices-per-process', '2', '--', sys.executable, PSUM, '--steps', '2'])
  assert r.returncode == 0, r.stdout + r.stderr
  lines = [l for l in r.stdout.splitlines() if 'PSUM' in l]
  # each process contributes (its id + 1) on each of its 2 devices: 2*1 + 2*2 = 6
  assert len(lines) == 4 and all('value=6.0 processes=2 devices=4' in l for l in lines), r.stdout
  assert sum('PRIMARY done' in l for l in r.stdout.splitlines()) == 1  # only process 0 reports


@pytest.mark.multiprocess
@pytest.mark.parametrize('how', ['exit', 'raise'])
def test_peer_failure_stops_job_in_bounded_time(how):
  t0 = time.monotonic()
  r = _launch(
    [
      '-n',
      '2',
      '--devices-per-process',
      '1',
      '--heartbeat',
      str(HEARTBEAT_S),
      '--grace',
      '60',
      '--',
      sys.executable,
      PSUM,
      '--steps',
      '1000',
      '--sleep',
      '0.1',
      '--die-at',
      '3',
      '--die-how',
      how,
    ]
  )
  elapsed = time.monotonic() - t0
  assert r.returncode != 0
  assert 'process 1 dying now' in r.stdout
  # the survivor is stopped by the coordination service, not by the launcher's kill-after-grace
  assert 'killing process' not in r.stderr, r.stderr
  # either the heartbeat monitor aborted it, or its next collective failed and the fail-fast hook exited
  p0 = '\n'.join(l for l in r.stdout.splitlines() if l.startswith('[p0]'))
  assert 'detected fatal errors' in p0 or 'uncaught exception' in p0, r.stdout[-3000:]
  assert elapsed < HEARTBEAT_S + 30, elapsed


@pytest.mark.multiprocess
def test_sigkill_of_one_process_stops_the_other():
  """Kill -9 from outside (a lost node), with children started directly rather than by the launcher."""
  port = launcher.free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, PSUM, '--steps', '1000', '--sleep', '0.1'],
      env=launcher.child_env(i, 2, 1, port, HEARTBEAT_S),
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  try:
    # wait until process 1 is inside the step loop
    for line in procs[1].stdout:
      if 'PSUM step=2' in line:
        break
    procs[1].send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    rc = procs[0].wait(timeout=HEARTBEAT_S + 60)
    elapsed = time.monotonic() - t0
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.wait()
  assert rc != 0
  assert elapsed < HEARTBEAT_S + 30, elapsed


SLURM_KEYS = (
  'SLURM_JOB_ID',
  'SLURM_STEP_NODELIST',
  'SLURM_NTASKS',
  'SLURM_PROCID',
  'SLURM_LOCALID',
  'SLURM_STEP_NUM_NODES',
  'CUDA_VISIBLE_DEVICES',
  'NEOBERT_COORDINATOR_PORT',
)


def _slurm_env(monkeypatch, **values):
  for k in SLURM_KEYS:
    monkeypatch.delenv(k, raising=False)
  for k, v in values.items():
    monkeypatch.setenv(k, str(v))


@pytest.mark.parametrize(
  'layout, expected_local',
  [
    # one process per node driving its 8 GPUs: no pinning (jax's own SLURM detection would pin GPU 0)
    (dict(SLURM_NTASKS=2, SLURM_STEP_NUM_NODES=2, SLURM_PROCID=1, SLURM_LOCALID=0), None),
    # one process per GPU, every GPU visible to every task: pin GPU number SLURM_LOCALID
    (dict(SLURM_NTASKS=16, SLURM_STEP_NUM_NODES=2, SLURM_PROCID=13, SLURM_LOCALID=5), (5,)),
    # one process per GPU, SLURM already bound one GPU per task (--gpus-per-task=1): that one GPU
    (dict(SLURM_NTASKS=16, SLURM_STEP_NUM_NODES=2, SLURM_PROCID=13, SLURM_LOCALID=5, CUDA_VISIBLE_DEVICES=5), None),
  ],
)
def test_slurm_layouts(monkeypatch, layout, expected_local):
  from neobert_jax import distributed

  _slurm_env(monkeypatch, SLURM_JOB_ID=4242, SLURM_STEP_NODELIST='gpu[017-018]', **layout)
  coordinator, nproc, pid, local = distributed._slurm_settings()
  assert coordinator.startswith('gpu017:')
  assert (nproc, pid, local) == (layout['SLURM_NTASKS'], layout['SLURM_PROCID'], expected_local)


def test_no_slurm_step_means_no_distributed(monkeypatch):
  from neobert_jax import distributed

  # inside the sbatch script itself (no srun step) and single-task steps are not multi-process jobs
  _slurm_env(monkeypatch, SLURM_JOB_ID=1, SLURM_NTASKS=2, SLURM_PROCID=0, SLURM_LOCALID=0)
  assert distributed._slurm_settings() is None
  _slurm_env(monkeypatch, SLURM_JOB_ID=1, SLURM_STEP_NODELIST='n1', SLURM_NTASKS=1, SLURM_PROCID=0, SLURM_LOCALID=0)
  assert distributed._slurm_settings() is None


@pytest.mark.multiprocess
def test_fake_slurm_step_on_this_machine():
  """Two processes that only see SLURM_* variables (as srun sets them) find each other and agree on a psum."""
  port = launcher.free_port()
  procs = []
  for i in range(2):
    env = {k: v for k, v in os.environ.items() if not k.startswith(('NEOBERT_', 'SLURM_'))}
    env.update(
      SLURM_JOB_ID='77',
      SLURM_STEP_NODELIST='localhost',
      SLURM_NTASKS='2',
      SLURM_PROCID=str(i),
      SLURM_LOCALID=str(i),
      SLURM_STEP_NUM_NODES='1',
      NEOBERT_COORDINATOR_PORT=str(port),
      JAX_PLATFORMS='cpu',
      NEOBERT_HEARTBEAT_TIMEOUT=str(HEARTBEAT_S),
      NEOBERT_NUM_CPU_DEVICES='1',
    )
    procs.append(
      subprocess.Popen(
        [sys.executable, PSUM, '--steps', '1'],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
      )
    )
  outs = [p.communicate(timeout=120)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  for out in outs:
    # one CPU device per process, ids 1 and 2: sum 3
    assert 'PSUM step=0 value=3.0 processes=2 devices=2' in out, out[-2000:]
