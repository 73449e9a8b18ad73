"""Multi-host training on one machine: 2 processes x 2 fake CPU devices against 1 process x 4 devices.

Both runs use the real trainer (neobert_jax.train.pretraining.train: state creation, sharded train step, Orbax
checkpointing with per-process shards and per-process data-iterator state) on the same 4-device mesh.
They must log the same losses, and the checkpoint the 2-process job writes must restore in a single
process on a different mesh (tensor parallel) and export to a PyTorch / Hugging Face model.

The data pipeline's global row stream does not depend on the process count (process p keeps its slice of each
global batch), so both runs see the same global batches and any difference comes from the multi-process machinery.
This file is also that worker: `python tests/test_scenario_multihost_training.py train|resume_then_restore ...`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3
OVERRIDES = {
  'model.dtype': 'float32',  # the comparisons below are about layout and processes, not numerics
  'model.num_layers': 2,
  'model.hidden_size': 64,
  'model.num_heads': 4,
  'model.intermediate_size': 128,
  'model.max_length': 64,
  'data.max_predictions': 16,
  'train.global_batch_size': 8,
  'train.num_steps': STEPS,
  # AdamW, as the tolerances below assume: Muon's Newton-Schulz rounds differently on another mesh (2.5e-5 here);
  # its sharded runs are tests/test_train_muon.py's
  'optimizer.name': 'adamw',
  'optimizer.peak_lr': 5e-3,
  'optimizer.muon_lr': 0.0,
  'optimizer.warmup_steps': 1,
  'optimizer.warmup_fraction': 0.0,
  'optimizer.schedule': 'cosine',  # tiny_cpu's 'linear' decays over train.num_steps, whatever decay_steps says
  # The rate reaches its floor at step 3 whatever train.num_steps is (decay_fraction would move it with
  # num_steps): the learning-rate table is part of the compiled step, so the SIGTERM test's longer job reads the
  # fixture's two-process step back from the compilation cache instead of compiling its own.
  'optimizer.decay_steps': STEPS,
  'eval.every_steps': 0,
  'eval.at_start': False,
  'checkpoint.every_steps': STEPS,
  'logging.log_every': 1,
  'logging.progress_bar': False,
  'logging.tensorboard': False,
  'logging.peak_flops_per_device': 1e12,
  'mesh.data': 1,
  'mesh.fsdp': 4,
  'mesh.tensor': 1,
}


# ----------------------------------------------------------------------------------------------- worker side


def _config():
  from neobert_jax import config as config_lib

  overrides = dict(OVERRIDES, **json.loads(os.environ.get('TEST_EXTRA_OVERRIDES', '{}')))
  return config_lib.load(os.path.join(ROOT, 'configs', 'tiny_cpu.py'), overrides)


def _cache_every_process_compiles() -> None:
  """jax writes the persistent compilation cache (tests/conftest.py's, inherited) from process 0 only, so process 1
  compiled its programs again in every job: about 10 s of CPU each time, the longest part of a job. Its programs
  have cache keys of their own (they address other devices), so here it writes them too, as process 0 does, and
  the next job's process 1 reads them back. (jax 0.10.2's private writer, pinned in pyproject.toml.)"""
  try:
    from jax._src import compilation_cache, compiler, config
    from jax._src import distributed as jax_distributed

    write = compiler._cache_write
  except (ImportError, AttributeError):  # another jax: process 1 compiles again, slower but the same test
    return

  def write_from_any_process(*args, **kwargs):
    try:
      cache_key, compile_time_secs, module_name, backend, executable, host_callbacks = args
    except ValueError:  # another signature: jax's own writer, as is
      return write(*args, **kwargs)
    if jax_distributed.global_state.process_id == 0 or host_callbacks or kwargs:
      return write(*args, **kwargs)
    if compile_time_secs >= config.persistent_cache_min_compile_time_secs.value:
      compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend, int(compile_time_secs))

  compiler._cache_write = write_from_any_process


def _train_worker(workdir: str) -> None:
  import logging
  import signal
  from neobert_jax import distributed

  info = distributed.initialize()
  _cache_every_process_compiles()
  logging.basicConfig(level=logging.INFO if info.is_primary else logging.WARNING, format='%(message)s')
  from tests.support.tiny_train import train_only

  cfg = _config()
  die_at = int(os.environ.get('TEST_DIE_AT_STEP', '-1'))
  sigterm_at = int(os.environ.get('TEST_SIGTERM_AT_STEP', '-1'))

  def on_step(done: int) -> None:
    # simulate a lost host: process 1 vanishes without any cleanup right after step `die_at`
    if done == die_at and info.process_id == 1:
      print(f'process 1 dying after step {done}', flush=True)
      os._exit(9)
    # simulate a preemption notice that reaches process 1 only
    if done == sigterm_at and info.process_id == 1:
      print(f'process 1 got SIGTERM after step {done}', flush=True)
      os.kill(os.getpid(), signal.SIGTERM)

  if os.environ.get('TEST_WHOLE_JOB'):  # the train command's whole job: training, then the report on process 0
    from neobert_jax.jobs.pretrain import pretrain

    result = pretrain(cfg, workdir, on_step)
  else:
    result = train_only(cfg, workdir, on_step=on_step)
  print(f'process {info.process_id} TRAIN_DONE final_step={result.final_step} preempted={result.preempted}', flush=True)


def _resume_worker(workdir: str) -> None:
  """One process resumes a checkpoint that 2 processes wrote (on a 2-device mesh instead of 4)."""
  import logging
  from neobert_jax import distributed

  distributed.initialize(num_cpu_devices=2)
  logging.basicConfig(level=logging.INFO, format='%(message)s')
  logging.getLogger('absl').setLevel(logging.WARNING)
  import jax
  import numpy as np
  from flax import nnx, traverse_util
  from neobert_jax.engine import checkpoint as ckpt
  from tests.support.tiny_train import train_only
  from neobert_jax.weights import runs

  cfg = _config()
  cfg.mesh.fsdp = 2
  _, saved = runs.restore_params(workdir, STEPS)
  seen = {}
  original = ckpt.restore_latest

  def spy(mngr, abstract, data_iter):
    out = original(mngr, abstract, data_iter)
    if out is not None:  # copied now: the train step donates the state's buffers
      seen['step'] = out[0]
      seen['params'] = traverse_util.flatten_dict(jax.device_get(nnx.to_pure_dict(out[1]['params'])), sep='.')
      seen['opt_step'] = int(np.asarray(out[1]['opt']['step'][...]))
      seen['mesh'] = dict(out[1]['params']['encoder']['layers']['qkv'][...].sharding.mesh.shape)
    return out

  ckpt.restore_latest = spy
  result = train_only(cfg, workdir)
  assert seen.get('step') == STEPS, seen.get('step')
  assert seen['opt_step'] == STEPS and seen['mesh']['fsdp'] == 2, (seen['opt_step'], seen['mesh'])
  assert sorted(seen['params']) == sorted(saved)
  for k in saved:
    np.testing.assert_array_equal(seen['params'][k], saved[k], err_msg=k)
  assert result.final_step == cfg.train.num_steps, result.final_step
  print(f'RESUME_OK step={seen["step"]} final_step={result.final_step}', flush=True)


def _restore_worker(workdir: str, reference_workdir: str, export_dir: str) -> None:
  """Single process, 2 devices, mesh tensor=2: restore the 2-process checkpoint, compare, export, run torch."""
  from neobert_jax import distributed

  distributed.initialize(num_cpu_devices=2)
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  from flax import nnx

  from neobert_jax import sharding as shd
  from neobert_jax.convert import export_hf, torch_ref
  from neobert_jax.engine import checkpoint as ckpt
  from neobert_jax.train import mlm
  from neobert_jax.weights import hf, runs

  cfg = runs.read_config(workdir)
  cfg.mesh = {'data': 1, 'fsdp': 1, 'tensor': 2}
  mesh = shd.make_mesh(dict(cfg.mesh))
  defs, abstract = mlm.abstract_train_state(cfg, mesh)
  mngr = ckpt.make_manager(workdir, keep=10, async_save=False)
  step, state = ckpt.restore_latest(mngr, abstract, None)
  assert step == STEPS, step
  qkv = state['params']['encoder']['layers']['qkv'][...]
  assert qkv.sharding.mesh.shape['tensor'] == 2 and 'tensor' in str(qkv.sharding.spec), qkv.sharding

  # the 2-process run's parameters equal the 1-process run's
  _, ours = runs.restore_params(workdir)
  _, ref = runs.restore_params(reference_workdir)
  assert sorted(ours) == sorted(ref)
  for k in ref:
    # The two processes sum gradients in another order than one process does, and Adam divides each gradient by its
    # own root mean square, so a gradient near zero that differs in its last bits moves its element by up to a
    # step's size (on the AMD CPU: one embedding element 3.6e-6 apart after 3 steps). All elements stay within
    # 2e-5, and all but one in a thousand within 2e-6: a wrong reduction moves most of them.
    np.testing.assert_allclose(ours[k], ref[k], rtol=2e-5, atol=2e-5, err_msg=k)
    off = ~np.isclose(ours[k], ref[k], rtol=2e-5, atol=2e-6)
    assert off.mean() <= 1e-3, (k, int(off.sum()), off.size)
  # the optimizer state came back too (Adam moments, step counter), laid out on the new mesh
  assert int(np.asarray(state['opt']['step'][...])) == STEPS

  # export to Hugging Face / PyTorch and compare logits with the restored, tensor-parallel JAX model
  export_hf.export_checkpoint(workdir, export_dir)
  hf_cfg, hf_flat = hf.read_hf_dir(export_dir)
  for k in ours:
    np.testing.assert_array_equal(hf_flat[k], ours[k], err_msg=k)
  torch_model = torch_ref.torch_model_from_flat(hf_flat, hf_cfg)
  ids = np.random.default_rng(0).integers(5, cfg.model.vocab_size, (2, 16)).astype(np.int32)
  with torch.no_grad():
    t_logits = torch_model(input_ids=torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()
  with shd.activate(mesh):
    model = nnx.merge(defs.model_def, state['params'])
    j_logits = np.asarray(jax.jit(lambda m, x: m(x))(model, jnp.asarray(ids)))
  np.testing.assert_allclose(j_logits, t_logits, rtol=1e-4, atol=1e-4)
  print(f'RESTORE_OK step={step} mesh={dict(mesh.shape)} max_logit_diff={np.abs(j_logits - t_logits).max():.2e}')


# ------------------------------------------------------------------------------------------------ test side


def _run(cmd, env, timeout=400):
  r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, f'{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}'
  return r


def _launch(workdir: str, heartbeat: int, *flags: str) -> list[str]:
  """The two-process job (2 CPU devices each) through launch/local.py, each process running this file's train."""
  return [
    sys.executable,
    os.path.join(ROOT, 'launch', 'local.py'),
    '-n',
    '2',
    '--devices-per-process',
    '2',
    '--heartbeat',
    str(heartbeat),
    *flags,
    '--',
    sys.executable,
    __file__,
    'train',
    workdir,
  ]


def _losses(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r['train/loss'] for r in rows if 'train/loss' in r]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  base = tmp_path_factory.mktemp('multihost')
  one, two = str(base / 'one_process'), str(base / 'two_processes')
  env = dict(os.environ, JAX_PLATFORMS='cpu', NEOBERT_NUM_CPU_DEVICES='4', PYTHONUNBUFFERED='1')
  for k in ('NEOBERT_COORDINATOR', 'NEOBERT_NUM_PROCESSES', 'NEOBERT_PROCESS_ID'):
    env.pop(k, None)
  _run([sys.executable, __file__, 'train', one], env)
  _run(_launch(two, 20), env)
  return base, one, two


def test_two_processes_match_one_process(runs):
  _, one, two = runs
  l1, l2 = _losses(one), _losses(two)
  assert len(l1) == STEPS and len(l2) == STEPS, (l1, l2)
  assert l2 == pytest.approx(l1, rel=1e-5), (l1, l2)
  # every process wrote its own array shards and its own data-iterator position
  step_dir = os.path.join(two, 'checkpoints', str(STEPS))
  assert {'ocdbt.process_0', 'ocdbt.process_1'} <= set(os.listdir(os.path.join(step_dir, 'params')))
  assert sorted(os.listdir(os.path.join(step_dir, 'data'))) == [
    'commit_success.txt',
    'process_0-of-2.json',
    'process_1-of-2.json',
  ]


@pytest.fixture(scope='module')
def one_process(runs):
  """The two single-process checks of the 2-process checkpoint (2 devices each), in one process: one start-up
  instead of two. It resumes a copy of the checkpoint (_resume_worker), then restores the original on a tensor-
  parallel mesh and exports it (_restore_worker); each prints its OK line or its traceback. (the copy, the output)"""
  base, one, two = runs
  workdir = base / 'resumed'
  shutil.copytree(two, workdir)
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    PYTHONUNBUFFERED='1',
    TEST_EXTRA_OVERRIDES=json.dumps({'train.num_steps': STEPS + 1}),  # the resume's; the restore reads the run's
  )
  for k in ('NEOBERT_COORDINATOR', 'NEOBERT_NUM_PROCESSES', 'NEOBERT_PROCESS_ID', 'NEOBERT_NUM_CPU_DEVICES'):
    env.pop(k, None)
  cmd = [sys.executable, __file__, 'resume_then_restore', str(workdir), two, one, str(base / 'hf_export')]
  r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
  return workdir, r.stdout + r.stderr


def test_checkpoint_restores_on_another_mesh_and_exports_to_pytorch(one_process):
  _, out = one_process
  assert 'RESTORE_OK' in out, out[-6000:]


def test_checkpoint_of_two_processes_resumes_in_one_process(one_process):
  """Elastic resume through the launcher: the data position is global, so one process continues exactly where the
  two left off (no replay, no warning), at its step, with the checkpoint never set aside."""
  workdir, out = one_process
  assert f'RESUME_OK step={STEPS} final_step={STEPS + 1}' in out, out[-6000:]
  assert 'data position written by 2 process(es), merged and restored on 1' in out and 'NOT the same' not in out, out[
    -4000:
  ]
  assert not [p for p in os.listdir(workdir / 'checkpoints') if 'corrupt' in p]
  assert sorted(os.listdir(workdir / 'checkpoints' / str(STEPS + 1) / 'data')) == [
    'commit_success.txt',
    'process_0-of-1.json',
  ]


def test_sigterm_on_one_process_stops_every_process_at_the_same_step(runs):
  """Only process 1 gets SIGTERM: both must agree on one step, save it together and exit cleanly."""
  base, _, _ = runs
  workdir = base / 'sigterm'
  steps = 60
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    PYTHONUNBUFFERED='1',
    TEST_SIGTERM_AT_STEP='2',
    TEST_EXTRA_OVERRIDES=json.dumps({'train.num_steps': steps, 'checkpoint.every_steps': 1000}),
  )
  r = _run(_launch(str(workdir), 10), env, timeout=240)
  out = r.stdout + r.stderr
  assert 'process 1 got SIGTERM after step 2' in out, out[-4000:]
  done = re.findall(r'process (\d) TRAIN_DONE final_step=(\d+) preempted=(\w+)', out)
  assert sorted(done) == sorted({(p, done[0][1], 'True') for p in '01'}), out[-4000:]
  saved = int(done[0][1])
  assert 2 <= saved < steps
  step_dir = workdir / 'checkpoints' / str(saved)
  assert sorted(os.listdir(step_dir / 'data')) == ['commit_success.txt', 'process_0-of-2.json', 'process_1-of-2.json']


def test_lost_process_stops_the_job_and_the_same_command_resumes(runs):
  """Process 1 dies mid-run: process 0 must stop by itself within the heartbeat bound; re-running the same
  command resumes from the last complete checkpoint and ends with the uninterrupted run's parameters."""
  base, _, two = runs
  workdir = str(base / 'crash_and_resume')
  heartbeat = 5
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    PYTHONUNBUFFERED='1',
    TEST_EXTRA_OVERRIDES=json.dumps({'checkpoint.every_steps': 1}),
  )
  cmd = _launch(workdir, heartbeat, '--grace', '120')
  crashed = subprocess.run(
    cmd, env=dict(env, TEST_DIE_AT_STEP='2'), cwd=ROOT, capture_output=True, text=True, timeout=400
  )
  out = crashed.stdout + crashed.stderr
  assert crashed.returncode != 0 and 'process 1 dying after step 2' in out, out[-4000:]
  assert 'killing process' not in out, out[-4000:]  # process 0 stopped on its own, not by the launcher
  # process 0 failed too (a collective, the checkpoint barrier or the heartbeat monitor noticed), in bounded time
  m = re.search(r'\[launch\] process 0 exited with status (-?\d+), ([\d.]+)s after the first failure', out)
  assert m and int(m.group(1)) != 0, out[-4000:]
  assert float(m.group(2)) < heartbeat + 30, m.group(0)

  resumed = _run(cmd, env)
  assert 'resumed from' in resumed.stdout, resumed.stdout[-3000:]
  # the interrupted-then-resumed job ends exactly where the uninterrupted one did (read here, as the bucket test
  # reads its runs: restore_params needs no mesh)
  import numpy as np
  from neobert_jax.weights import runs as run_dirs  # `runs` is this test's fixture

  _, a = run_dirs.restore_params(workdir)
  _, b = run_dirs.restore_params(two)
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_allclose(a[k], b[k], rtol=2e-5, atol=2e-6, err_msg=k)


def bucket_job(workdir: str, extra: dict, tmp_path, extra_env: dict) -> tuple[list[int], str]:
  """The two-process job (2 CPU devices each) of hosts without a shared path: each its own working directory and
  cache under tmp_path, running this file's train on `workdir` (on a bucket) with the overrides `extra`; returns the
  exit codes and the output."""
  import socket

  import gcsfs
  from etils.epath import backend as epath_backend

  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  procs = []
  for pid in range(2):
    host = tmp_path / f'host{pid}'  # each "host" has its own working directory and cache
    host.mkdir(exist_ok=True)
    env = dict(
      os.environ,
      JAX_PLATFORMS='cpu',
      PYTHONUNBUFFERED='1',
      PYTHONPATH=ROOT,
      NEOBERT_COORDINATOR=f'127.0.0.1:{port}',
      NEOBERT_NUM_PROCESSES='2',
      NEOBERT_PROCESS_ID=str(pid),
      NEOBERT_NUM_CPU_DEVICES='2',
      NEOBERT_HEARTBEAT_TIMEOUT='5',
      NEOBERT_JAX_CACHE=str(host / 'cache'),
      TEST_EXTRA_OVERRIDES=json.dumps(extra),
      **extra_env,
    )
    procs.append(
      subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), 'train', workdir],
        cwd=host,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  outs = [p.communicate(timeout=400)[0] for p in procs]
  # This process's listings predate what the job wrote: forget them in every gcsfs instance, epath's own included
  # (epath keeps its instance after other tests clear gcsfs's instance cache).
  for fs in [*gcsfs.GCSFileSystem._cache.values(), epath_backend.fsspec_backend.fs(workdir)]:
    fs.invalidate_cache()
  return [p.returncode for p in procs], ''.join(outs)


@pytest.mark.server
def test_two_hosts_without_a_shared_path_train_and_resume_through_a_bucket(runs, gcs, tmp_path):
  """2 processes x 2 devices whose working directories and caches differ (no local path in common): the workdir and
  the prepared data live on the bucket (a real GCS server), each host reading its own share. Process 1 vanishes after
  step 1 (as under kill -9), then a SIGTERM reaches process 1 after step 2; each time the same command resumes from
  the last checkpoint on the bucket, and the run passes through step 3 bit for bit where the uninterrupted 2-process
  run ended."""
  from etils import epath
  from neobert_jax import paths
  from neobert_jax.data import pipeline
  from neobert_jax.weights import runs as run_dirs  # `runs` is this test's fixture

  _, _, two = runs
  cfg = _config()
  local_data, _ = pipeline.open_prepared(cfg.data, int(cfg.model.max_length), int(cfg.model.vocab_size))
  data_url = f'{gcs}/data/multihost'
  paths.publish_dir(local_data, epath.Path(data_url), 'manifest.json')
  workdir = f'{gcs}/runs/multihost'
  # data.tokenizer '': trust the manifest (a built-in vocabulary is learned per machine, and these hosts have none)
  extra = {'data.dir': data_url, 'data.tokenizer': '', 'checkpoint.every_steps': 1}

  def job(extra_env):
    return bucket_job(workdir, extra, tmp_path, extra_env)

  # process 1 vanishes after step 1, as under kill -9; then a preemption notice reaches process 1 after step 2
  codes, out = job({'TEST_DIE_AT_STEP': '1'})
  assert codes[1] != 0 and 'process 1 dying after step 1' in out, out[-3000:]
  assert run_dirs.latest_step(workdir) in (None, 1), out[-3000:]
  codes, out = job({'TEST_SIGTERM_AT_STEP': '2'})
  assert codes == [0, 0] and 'process 1 got SIGTERM after step 2' in out, out[-3000:]
  # The same command resumes once more, as the train command's whole job, one step past the uninterrupted run and
  # evaluating at its end (one job instead of a resume to step 3 and then another to step 4; the rate reaches its
  # floor at step 3 whatever train.num_steps is, so steps 1-3 are the uninterrupted run's): both processes exit 0 and
  # the report (its table and plot) is on the bucket.
  whole = {**extra, 'train.num_steps': STEPS + 1, 'eval.every_steps': STEPS + 1, 'eval.probe_task': ''}
  codes, out = bucket_job(workdir, whole, tmp_path, {'TEST_WHOLE_JOB': '1'})
  assert codes == [0, 0] and f'final_step={STEPS + 1}' in out, out[-3000:]
  plot = epath.Path(f'{workdir}/loss_curve.png')
  assert plot.is_file() and plot.read_bytes().startswith(b'\x89PNG'), out[-3000:]
  rows = [json.loads(x) for x in epath.Path(f'{workdir}/metrics.jsonl').read_text().splitlines() if x.strip()]
  by_step = {r['step']: r['train/loss'] for r in rows if 'train/loss' in r}  # a replayed step logs again
  assert sorted(by_step) == [1, 2, 3, 4]
  # the same host count: bit for bit the uninterrupted 2-process run on local data, at its last step
  assert [by_step[s] for s in (1, 2, 3)] == _losses(two), (by_step, _losses(two))
  _, ours = run_dirs.restore_params(workdir, STEPS)
  _, ref = run_dirs.restore_params(two)
  assert sorted(ours) == sorted(ref)
  for k in ref:
    assert (ours[k] == ref[k]).all(), k


if __name__ == '__main__':
  sys.path.insert(0, ROOT)
  mode, args = sys.argv[1], sys.argv[2:]
  if mode == 'train':
    _train_worker(*args)
  elif mode == 'resume_then_restore':  # one process for both checks, each reported on its own
    import traceback

    failed = False
    for worker, worker_args in ((_resume_worker, args[:1]), (_restore_worker, args[1:])):
      try:
        worker(*worker_args)
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
        failed = True
    sys.exit(1 if failed else 0)
  else:
    raise SystemExit(f'unknown mode {mode}')
