"""Pod launchers, rendered and never run: launch/tpu/multislice.py (2 x v5p-64, GKE JobSet and gcloud ssh) and
launch/slurm/render.py (2 nodes x 8 H100). Every worker gets the same train command and bucket workdir, a unique
process id, the same coordinator on worker 0; and the start-up path (neobert_jax.distributed.initialize, then
jax's own TPU cluster detection where it hands over) derives exactly those from each worker's environment."""

import importlib.util
import os
import sys
import types

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKDIR = 'gs://bucket/run'
DATA = '--config.data.dir=gs://bucket/data'


def _script(rel):
  """launch/ is a folder of scripts, not a package: load one by path."""
  name = os.path.splitext(os.path.basename(rel))[0]
  spec = importlib.util.spec_from_file_location(f'launch_{name}', os.path.join(ROOT, rel))
  module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look themselves up there
  spec.loader.exec_module(module)
  return module


multislice = _script('launch/tpu/multislice.py')
render = _script('launch/slurm/render.py')


@pytest.fixture(autouse=True)
def _nothing_runs(monkeypatch):
  """A dry run or a rendering must not start gcloud, kubectl or sbatch."""

  def refuse(*a, **k):
    raise AssertionError(f'launcher tried to run {a}')

  for mod in (multislice, render):
    monkeypatch.setattr(mod, 'subprocess', types.SimpleNamespace(run=refuse, Popen=refuse))


def _start(monkeypatch, env, tpu_cluster=None):
  """distributed.initialize() in a process whose environment is `env`, with jax replaced by a recorder.

  On TPU the recorder does what jax.distributed.initialize() does without arguments: ask jax's TPU cluster
  (tpu_cluster) for the process id, count and coordinator. Returns (DistributedInfo, recorded arguments, coordinator).
  """
  from neobert_jax import distributed

  for k in list(os.environ):
    if k.startswith(('NEOBERT_', 'SLURM', 'MEGASCALE_', 'TPU_', 'CUDA_VISIBLE_DEVICES')):
      monkeypatch.delenv(k)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  seen = {}

  def initialize(**kwargs):
    seen.update(kwargs)
    if tpu_cluster is not None:
      seen.update(
        pid=tpu_cluster.get_process_id(),
        count=tpu_cluster.get_process_count(),
        tpu_coordinator=tpu_cluster.get_coordinator_address(None, None),
      )

  fake_jax = types.SimpleNamespace(
    config=types.SimpleNamespace(update=lambda *a: None),
    distributed=types.SimpleNamespace(initialize=initialize),
    process_index=lambda: seen['pid'],
    process_count=lambda: seen['count'],
  )
  monkeypatch.setattr(distributed, 'jax', fake_jax)
  monkeypatch.setattr(distributed, '_INFO', None)
  monkeypatch.setattr(distributed, '_on_tpu_vm', lambda: tpu_cluster is not None)
  monkeypatch.setattr(sys, 'excepthook', sys.excepthook)  # initialize() installs its own; put it back after
  info = distributed.initialize()
  return info, seen, seen.get('tpu_coordinator', info.coordinator_address)


@pytest.fixture
def tpu_clusters(monkeypatch):
  from jax._src.clusters import cloud_tpu_cluster as c  # what jax.distributed.initialize() uses on TPU VMs

  # It checks the coordinator's name resolves before returning it; these host names are examples.
  monkeypatch.setattr(c.BaseTpuCluster, 'wait_for_coordinator', classmethod(lambda cls, addr, timeout: None))
  return c


def _same_everywhere(values):
  assert len(set(values)) == 1, values
  return values[0]


def test_tpu_gke_jobset_two_slices_v5p_64(monkeypatch, capsys, tpu_clusters):
  args = [
    'gke',
    '--slices',
    '2',
    '--tpu',
    'v5p-64',
    '--image',
    'us-docker.pkg.dev/p/neobert:1',
    '--workdir',
    WORKDIR,
    '--',
    DATA,
  ]
  assert multislice.main(args) == 0
  manifest = yaml.safe_load(capsys.readouterr().out)
  job = manifest['spec']['replicatedJobs'][0]
  pod = job['template']['spec']['template']['spec']
  assert (manifest['kind'], job['replicas'], job['template']['spec']['parallelism']) == ('JobSet', 2, 8)
  assert pod['nodeSelector'] == {
    'cloud.google.com/gke-tpu-accelerator': 'tpu-v5p-slice',
    'cloud.google.com/gke-tpu-topology': '2x4x4',
  }  # v5p-64 = 32 chips, 8 hosts
  assert pod['containers'][0]['resources']['limits'] == {'google.com/tpu': 4}
  assert (
    manifest['metadata']['annotations']['alpha.jobset.sigs.k8s.io/exclusive-topology']
    == 'cloud.google.com/gke-nodepool'
  )

  workers = multislice.jobset_workers(manifest)
  assert len(workers) == 16  # processes = hosts: 2 slices x 8
  argv = _same_everywhere([tuple(w.argv) for w in workers])
  assert argv == (
    'python',
    '-m',
    'neobert_jax.train',
    '--config=configs/neobert_250m.py',
    f'--workdir={WORKDIR}',
    '--config.mesh.dcn_data=2',
    DATA,
  )
  assert sorted({w.env['MEGASCALE_SLICE_ID'] for w in workers}) == ['0', '1']
  assert _same_everywhere([w.env['MEGASCALE_NUM_SLICES'] for w in workers]) == '2'
  assert _same_everywhere([w.env['MEGASCALE_PORT'] for w in workers]) == '8080'
  coordinator = _same_everywhere([w.env['MEGASCALE_COORDINATOR_ADDRESS'] for w in workers])
  assert coordinator == f'{workers[0].host}:8080' and (workers[0].slice_id, workers[0].worker_id) == (0, 0)

  ids = []
  for w in workers:
    info, seen, jax_coordinator = _start(monkeypatch, w.env, tpu_clusters.GkeTpuCluster)
    # distributed.py leaves a TPU start to jax's cluster detection: no coordinator or ids of its own
    assert info.method == 'tpu' and 'coordinator_address' not in seen and 'process_id' not in seen
    assert (info.num_processes, jax_coordinator) == (16, f'{workers[0].host}:8482')
    assert info.process_id == int(w.env['MEGASCALE_SLICE_ID']) * 8 + w.worker_id  # slice-major
    ids.append(info.process_id)
  assert sorted(ids) == list(range(16))


def test_tpu_gcloud_two_slices_v5p_64(monkeypatch, capsys, tpu_clusters):
  args = [
    'gcloud',
    '--dry-run',
    '--slices',
    '2',
    '--tpu',
    'v5p-64',
    '--name',
    'neobert',
    '--zone',
    'us-east5-a',
    '--coordinator-ip',
    '10.0.0.2',
    '--workdir',
    WORKDIR,
    '--',
    DATA,
  ]
  assert multislice.main(args) == 0
  out = capsys.readouterr().out
  ssh = [l for l in out.splitlines() if l.startswith('gcloud ')]
  assert len(ssh) == 2 and all('--worker=all' in l for l in ssh)
  assert 'ssh neobert-0 ' in ssh[0] and 'ssh neobert-1 ' in ssh[1]
  assert 'MEGASCALE_SLICE_ID=0 ' in ssh[0] and 'MEGASCALE_SLICE_ID=1 ' in ssh[1]

  commands, workers = multislice.gcloud_plan(multislice.parse_args(args), multislice.parse_slice('v5p-64'))
  assert len(commands) == 2 and len(workers) == 16
  assert f'--workdir={WORKDIR}' in _same_everywhere([tuple(w.argv) for w in workers])
  assert '--config.mesh.dcn_data=2' in workers[0].argv
  assert _same_everywhere([w.env['MEGASCALE_COORDINATOR_ADDRESS'] for w in workers]) == '10.0.0.2:8080'
  assert sorted({w.env['MEGASCALE_SLICE_ID'] for w in workers}) == ['0', '1']

  ids = []
  for w in workers:
    # A TPU VM knows its rank and its slice's hosts from the metadata server; slice 0 worker 0 is 10.0.0.2.
    metadata = {
      'agent-worker-number': str(w.worker_id),
      'worker-network-endpoints': ','.join(f'10.0.{w.slice_id}.{i + 2}' for i in range(8)),
    }
    monkeypatch.setattr(tpu_clusters, 'get_metadata', lambda key, m=metadata: (m[key], 200))
    info, _, jax_coordinator = _start(monkeypatch, w.env, tpu_clusters.GceTpuCluster)
    assert (info.method, info.num_processes, jax_coordinator) == ('tpu', 16, '10.0.0.2:8482')
    ids.append(info.process_id)
  assert ids == list(range(16))  # slice-major, in the order the launcher lists them


@pytest.mark.parametrize('layout, per_node', [('node', 1), ('gpu', 8)])
def test_slurm_two_nodes_of_8_h100(monkeypatch, capsys, layout, per_node):
  args = [
    '--dry-run',
    '--nodes',
    '2',
    '--layout',
    layout,
    '--workdir',
    WORKDIR,
    '--repo',
    '/shared/neobert-jax',
    '--',
    DATA,
  ]
  assert render.main(args) == 0
  out = capsys.readouterr().out
  submit = out.splitlines()[0]
  assert submit.startswith(f'WORKDIR={WORKDIR} ') and ' sbatch --nodes=2 --gpus-per-node=8 ' in submit
  assert f'--ntasks-per-node={per_node} ' in submit and submit.endswith(f'--config.mesh.dcn_data=2 {DATA}')

  workers = render.workers(render.parse_args(args))
  assert len(workers) == 2 * per_node
  argv = _same_everywhere([tuple(a) for _, _, a in workers])
  assert argv == (
    '/shared/neobert-jax/.venv/bin/python',
    '-m',
    'neobert_jax.train',
    '--config=configs/neobert_250m.py',
    f'--workdir={WORKDIR}',
    '--config.mesh.dcn_data=2',
    DATA,
  )
  # what the sbatch script itself exports reaches every task
  assert all(env['XLA_PYTHON_CLIENT_MEM_FRACTION'] == '0.92' for _, env, _ in workers)

  ids = []
  for host, env, _ in workers:
    info, seen, coordinator = _start(monkeypatch, env)
    assert (info.method, info.num_processes, coordinator) == ('slurm', 2 * per_node, 'gpu001:6002')
    assert host == ('gpu001' if info.process_id < per_node else 'gpu002')  # the coordinator runs on process 0's node
    # a process per node drives all 8 GPUs; a process per GPU drives GPU number SLURM_LOCALID
    assert seen['local_device_ids'] == (None if per_node == 1 else [int(env['SLURM_LOCALID'])])
    ids.append(info.process_id)
  assert ids == list(range(2 * per_node))


def test_refusals(capsys):
  with pytest.raises(SystemExit, match='single-host'):
    multislice.parse_slice('v5litepod-8')
  assert multislice.parse_slice('v5litepod-256') == multislice.Slice('v5e', '16x16', 256)
  with pytest.raises(SystemExit):
    render.parse_args(['--nodes', '2', '--layout', 'gpu', '--gpus-per-node', '4', '--workdir', WORKDIR])
  assert 'starts 8 tasks per node' in capsys.readouterr().err
