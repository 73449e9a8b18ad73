#!/usr/bin/env python
"""TPU multi-slice: S slices of one TPU type train as one job, joined over the data-centre network (DCN).

    # GKE: a JobSet manifest, one replicated Job per slice
    python launch/tpu/multislice.py gke --slices 2 --tpu v5p-64 --image IMAGE --workdir gs://BUCKET/run \
        -- --config.data.dir=gs://BUCKET/data | kubectl apply -f -
    # TPU VMs (e.g. one queued resource with --node-count=2 --node-prefix=neobert): one ssh --worker=all per slice
    python launch/tpu/multislice.py gcloud --slices 2 --tpu v5p-64 --name neobert --zone us-east5-a \
        --workdir gs://BUCKET/run -- --config.data.dir=gs://BUCKET/data

--dry-run prints every worker's command line and environment and runs nothing. Arguments after `--` go to the
trainer. Every host runs the same command; what differs is the environment, read by libtpu (to build the DCN
links) and by jax.distributed.initialize() (to number the processes):

  MEGASCALE_NUM_SLICES           S
  MEGASCALE_SLICE_ID             this host's slice, 0..S-1
  MEGASCALE_COORDINATOR_ADDRESS  host:port of slice 0's worker 0, where the DCN runtime's coordinator listens; jax
                                 starts its own coordination service on the same host (port 8482)
  MEGASCALE_PORT                 the port the DCN runtime uses on every host

A host's rank inside its slice comes from the platform: TPU_WORKER_ID / TPU_WORKER_HOSTNAMES (GKE's TPU webhook)
or the TPU VM metadata. jax numbers processes slice-major: process_id = slice_id * hosts_per_slice + worker_id.
`--config.mesh.dcn_data=S` makes the mesh's data axis span the slices, so FSDP and tensor traffic stays on each
slice's inter-chip links and only the gradient reduction crosses the DCN (`--dcn-axis fsdp` shards over slices).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import subprocess
import sys

import yaml

from neobert_jax.aot import targets

# GKE node label of each generation's multi-host slices (cloud.google.com/gke-tpu-accelerator).
GKE_ACCELERATOR = {
  'v4': 'tpu-v4-podslice',
  'v5e': 'tpu-v5-lite-podslice',
  'v5p': 'tpu-v5p-slice',
  'v6e': 'tpu-v6e-slice',
}
CHIPS_PER_HOST = 4  # every host of a multi-host v4 / v5e / v5p / v6e slice
TPU_RUNTIME_PORT = 8471  # libtpu within a slice
JAX_COORDINATOR_PORT = 8482  # jax's fixed port for its coordination service on TPU
# The JobSet annotations that carry a pod's slice (child Job) index and its index within the slice.
SLICE_FIELD = "metadata.annotations['jobset.sigs.k8s.io/job-index']"
WORKER_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# The JobSet's name and restart attempt: how a restarted JobSet proves the workdir's lease is its own (lease.py).
JOBSET_FIELDS = {
  'JOBSET_NAME': "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
  'JOBSET_RESTART_ATTEMPT': "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']",
}
# Shared with launch/tpu/pod.sh, so its copy / setup / tail / logs / stop work on each slice (TPU_NAME=<name>-<s>).
REMOTE_DIR, LOG_NAME, PID_NAME = 'neobert-jax', 'neobert-train.log', 'neobert-train.pid'


@dataclasses.dataclass(frozen=True)
class Slice:
  generation: str  # v4 | v5e | v5p | v6e
  topology: str  # chip grid, e.g. 2x4x4
  chips: int

  @property
  def hosts(self) -> int:
    return self.chips // CHIPS_PER_HOST


@dataclasses.dataclass(frozen=True)
class Worker:
  slice_id: int
  worker_id: int
  host: str
  env: dict[str, str]
  argv: list[str]


def parse_slice(tpu: str) -> Slice:
  """'v5p-64' (Google's names: v4/v5p count TensorCores), 'v5litepod-256', 'v6e-64' -> chips and topology."""
  target = targets.parse_target('tpu:' + tpu.lower().replace('v5litepod-', 'v5e-'))
  generation, topology = target.tpu_topology.split(':')
  # Multi-slice joins multi-host slices only; 8 chips of v5e/v6e, or 4 of v4/v5p, are one host.
  if target.num_devices <= (4 if target.chip.dims == 3 else 8):
    raise SystemExit(f'{tpu}: a single-host slice; multi-slice needs slices of several hosts')
  return Slice(generation, topology, target.num_devices)


def train_argv(python: str, args) -> list[str]:
  argv = [python, '-m', 'neobert_jax.train', f'--config={args.config}', f'--workdir={args.workdir}']
  if args.slices > 1:
    argv.append(f'--config.mesh.dcn_{args.dcn_axis}={args.slices}')
  return argv + args.trainer_args


def megascale_env(slices: int, slice_id: str, coordinator_host: str, port: int) -> dict[str, str]:
  if slices == 1:
    return {}  # one slice: no DCN runtime, and jax finds its coordinator from the slice's own hosts
  return {
    'MEGASCALE_NUM_SLICES': str(slices),
    'MEGASCALE_SLICE_ID': slice_id,
    'MEGASCALE_COORDINATOR_ADDRESS': f'{coordinator_host}:{port}',
    'MEGASCALE_PORT': str(port),
  }


# ------------------------------------------------------------------------------------------------------ GKE
def jobset(args, tpu: Slice) -> dict:
  """The JobSet: replicatedJob 'slice' with one Job per slice and one pod per host."""
  name = args.name
  # JobSet gives pod <name>-slice-<s>-<w> a DNS name under a headless service named after the JobSet.
  coordinator = f'{name}-slice-0-0.{name}'
  # The slice id differs per slice Job: each pod reads it from its own JobSet annotation.
  env = [
    {'name': k, 'valueFrom': {'fieldRef': {'fieldPath': SLICE_FIELD}}}
    if k == 'MEGASCALE_SLICE_ID'
    else {'name': k, 'value': v}
    for k, v in megascale_env(args.slices, '', coordinator, args.megascale_port).items()
  ]
  env.append({'name': 'NEOBERT_HEARTBEAT_TIMEOUT', 'value': str(args.heartbeat)})
  env += [{'name': k, 'valueFrom': {'fieldRef': {'fieldPath': f}}} for k, f in JOBSET_FIELDS.items()]
  ports = [TPU_RUNTIME_PORT, JAX_COORDINATOR_PORT] + ([args.megascale_port] if args.slices > 1 else [])
  container = {
    'name': 'train',
    'image': args.image,
    'command': train_argv(args.python, args),
    'env': env,
    'ports': [{'containerPort': p} for p in ports],
    'resources': {'limits': {'google.com/tpu': CHIPS_PER_HOST}},
  }
  pod = {
    'restartPolicy': 'Never',
    # Host networking: the DCN runtime and the coordinators talk over the hosts' own network (GKE's TPU examples).
    'hostNetwork': True,
    'dnsPolicy': 'ClusterFirstWithHostNet',
    # Preemption or maintenance sends SIGTERM: time for the trainer to write its checkpoint.
    'terminationGracePeriodSeconds': args.grace,
    'nodeSelector': {
      'cloud.google.com/gke-tpu-accelerator': GKE_ACCELERATOR[tpu.generation],
      'cloud.google.com/gke-tpu-topology': tpu.topology,
    },
    'containers': [container],
  }
  return {
    'apiVersion': 'jobset.x-k8s.io/v1alpha2',
    'kind': 'JobSet',
    # exclusive-topology: each slice's Job gets a node pool (= one physical slice) of its own.
    'metadata': {
      'name': name,
      'annotations': {'alpha.jobset.sigs.k8s.io/exclusive-topology': 'cloud.google.com/gke-nodepool'},
    },
    'spec': {
      # Any failed pod restarts every slice (synchronous training cannot continue short of a host); the
      # trainer resumes from the last checkpoint under --workdir.
      'failurePolicy': {'maxRestarts': args.max_restarts},
      'network': {'enableDNSHostnames': True},
      'replicatedJobs': [
        {
          'name': 'slice',
          'replicas': args.slices,
          'template': {
            'spec': {
              'parallelism': tpu.hosts,
              'completions': tpu.hosts,
              'completionMode': 'Indexed',
              'backoffLimit': 0,
              'template': {'spec': pod},
            }
          },
        }
      ],
    },
  }


def jobset_workers(manifest: dict) -> list[Worker]:
  """Each pod's command and environment as it will run: the manifest's env with its annotations filled in, plus
  what GKE's TPU webhook injects into every pod of an indexed TPU Job (its rank and its slice's hosts)."""
  name = manifest['metadata']['name']
  job = manifest['spec']['replicatedJobs'][0]
  hosts = job['template']['spec']['parallelism']
  container = job['template']['spec']['template']['spec']['containers'][0]
  workers = []
  for s in range(job['replicas']):
    names = [f'{name}-{job["name"]}-{s}-{w}.{name}' for w in range(hosts)]
    for w in range(hosts):
      fields = {SLICE_FIELD: str(s), WORKER_FIELD: str(w)}
      fields.update({JOBSET_FIELDS['JOBSET_NAME']: name, JOBSET_FIELDS['JOBSET_RESTART_ATTEMPT']: '0'})
      env = {
        e['name']: e['value'] if 'value' in e else fields[e['valueFrom']['fieldRef']['fieldPath']]
        for e in container['env']
      }
      env.update(TPU_WORKER_ID=str(w), TPU_WORKER_HOSTNAMES=','.join(names))
      workers.append(Worker(s, w, names[w], env, list(container['command'])))
  return workers


# --------------------------------------------------------------------------------------------------- gcloud
def slice_names(args) -> list[str]:
  # A queued resource with --node-count=S --node-prefix=NAME names its TPU VMs NAME-0 .. NAME-(S-1).
  return [f'{args.name}-{s}' for s in range(args.slices)] if args.slices > 1 else [args.name]


def coordinator_ip(args) -> str:
  """Internal IP of slice 0's worker 0 (asked from gcloud unless given; a placeholder in a dry run)."""
  if args.coordinator_ip:
    return args.coordinator_ip
  if args.dry_run:
    return '<internal IP of %s worker 0>' % slice_names(args)[0]
  out = subprocess.run(
    [
      'gcloud',
      'compute',
      'tpus',
      'tpu-vm',
      'describe',
      slice_names(args)[0],
      f'--zone={args.zone}',
      *project_flag(args),
      '--format=value(networkEndpoints[0].ipAddress)',
    ],
    check=True,
    capture_output=True,
    text=True,
  ).stdout
  return out.split(';')[0].strip()


def project_flag(args) -> list[str]:
  return [f'--project={args.project}'] if args.project else []


def gcloud_plan(args, tpu: Slice) -> tuple[list[list[str]], list[Worker]]:
  """One `gcloud ... ssh --worker=all` per slice, and each worker's environment under it."""
  ip = coordinator_ip(args)
  train = train_argv('.venv/bin/python', args)
  commands, workers = [], []
  for s, vm in enumerate(slice_names(args)):
    env = megascale_env(args.slices, str(s), ip, args.megascale_port)
    env['NEOBERT_HEARTBEAT_TIMEOUT'] = str(args.heartbeat)
    assigns = ' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())
    # setsid nohup: training outlives the ssh session; one log and pid file per worker, as pod.sh does.
    remote = (
      f'cd ~/{REMOTE_DIR} && {assigns} setsid nohup {shlex.join(train)} > ~/{LOG_NAME} 2>&1 < /dev/null '
      f'& echo $! > ~/{PID_NAME}; echo started on $(hostname)'
    )
    commands.append(
      [
        'gcloud',
        'compute',
        'tpus',
        'tpu-vm',
        'ssh',
        vm,
        f'--zone={args.zone}',
        *project_flag(args),
        '--worker=all',
        f'--command={remote}',
      ]
    )
    # The worker's rank in its slice comes from the VM metadata (agent-worker-number), not from this command.
    workers += [Worker(s, w, f'{vm} worker {w}', dict(env), train) for w in range(tpu.hosts)]
  return commands, workers


# ------------------------------------------------------------------------------------------------------ main
def print_workers(workers: list[Worker], out=sys.stdout) -> None:
  for w in workers:
    print(f'# slice {w.slice_id} worker {w.worker_id}: {w.host}', file=out)
    for k, v in sorted(w.env.items()):
      print(f'    {k}={v}', file=out)
    print(f'    $ {shlex.join(w.argv)}', file=out)


def parse_args(argv: list[str]):
  argv, trainer_args = (argv[: argv.index('--')], argv[argv.index('--') + 1 :]) if '--' in argv else (argv, [])
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = p.add_subparsers(dest='form', required=True)
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument('--slices', type=int, required=True, help='number of slices (S)')
  common.add_argument('--tpu', required=True, help='slice type, e.g. v5p-64, v5litepod-256, v6e-64')
  common.add_argument('--workdir', required=True, help='run directory every host writes, e.g. gs://bucket/run')
  common.add_argument('--config', default='configs/neobert_250m.py')
  common.add_argument('--name', default='neobert', help='JobSet name / TPU VM name prefix')
  common.add_argument(
    '--dcn-axis', choices=('data', 'fsdp'), default='data', help='mesh axis that spans the slices (mesh.dcn_<axis>=S)'
  )
  common.add_argument('--megascale-port', type=int, default=8080)
  common.add_argument('--heartbeat', type=int, default=120, help='NEOBERT_HEARTBEAT_TIMEOUT (seconds)')
  common.add_argument('--dry-run', action='store_true', help="print each worker's command and environment")
  gke = sub.add_parser('gke', parents=[common], help='print a JobSet manifest')
  gke.add_argument('--image', required=True, help='container image with the repository and its environment')
  gke.add_argument('--python', default='python', help='interpreter inside the image')
  gke.add_argument('--max-restarts', type=int, default=10)
  gke.add_argument('--grace', type=int, default=180, help='seconds between SIGTERM and SIGKILL')
  gc = sub.add_parser('gcloud', parents=[common], help='start training on existing TPU VMs over ssh')
  gc.add_argument('--zone', required=True)
  gc.add_argument('--project')
  gc.add_argument('--coordinator-ip', help="slice 0 worker 0's internal IP (default: asked from gcloud)")
  args = p.parse_args(argv)
  args.trainer_args = trainer_args
  if args.slices < 1:
    p.error('--slices must be at least 1')
  return args


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  tpu = parse_slice(args.tpu)
  if args.form == 'gke':
    manifest = jobset(args, tpu)
    if args.dry_run:
      print_workers(jobset_workers(manifest))
    else:
      print(yaml.safe_dump(manifest, sort_keys=False), end='')
    return 0
  commands, workers = gcloud_plan(args, tpu)
  if args.dry_run:
    for c in commands:
      print(shlex.join(c))
    print_workers(workers)
    return 0
  # All slices at once: each command only starts the detached trainers and returns.
  procs = [subprocess.Popen(c) for c in commands]
  return max(p.wait() for p in procs)


if __name__ == '__main__':
  sys.exit(main())
