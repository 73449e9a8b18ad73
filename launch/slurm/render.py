#!/usr/bin/env python
"""Submit a multi-node SLURM GPU job: N nodes x G GPUs, the mesh's data axis across nodes, FSDP inside each node.

    python launch/slurm/render.py --nodes 2 --workdir gs://BUCKET/run -- --config.data.dir=gs://BUCKET/data
    python launch/slurm/render.py --nodes 2 --layout gpu --workdir /shared/runs/x --dry-run

It submits one of the sbatch files beside it with the node count, the trainer flags and
`--config.mesh.dcn_data=N` (`--dcn-axis fsdp`: dcn_fsdp): the mesh's per-node sizes (data / fsdp / tensor) cover
one node's GPUs, so parameter all-gathers stay on NVLink and only the gradient reduction crosses the network.
  --layout node  node_per_process.sbatch: one process per node driving its G GPUs (recommended)
  --layout gpu   gpu_per_process.sbatch: one process per GPU (that script starts 8 tasks per node)

Every process finds the coordinator the same way (neobert_jax/distributed.py, SLURM branch): the first host of
SLURM_STEP_NODELIST, port NEOBERT_COORDINATOR_PORT, which this sets. Submit from the repository root (the scripts'
REPO defaults to the submit directory).

--dry-run prints the sbatch command, then every process's command line and environment as srun will start it
(the SLURM_* variables srun sets, on example host names), and submits nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {'node': 'node_per_process.sbatch', 'gpu': 'gpu_per_process.sbatch'}
GPU_LAYOUT_TASKS = 8  # gpu_per_process.sbatch's `srun --ntasks-per-node=8`


def script_defaults(script: str) -> dict[str, str]:
  """The variables the sbatch script exports with a default (`export X="${X:-value}"`): read from the script
  itself, so the dry run shows what the tasks really get."""
  with open(os.path.join(HERE, script)) as f:
    return dict(re.findall(r'^export (\w+)="\$\{\1:-([^}]*)\}"', f.read(), re.M))


def trainer_flags(args) -> list[str]:
  """The flags after --config / --workdir (the sbatch scripts pass their arguments on to the trainer)."""
  return ([f'--config.mesh.dcn_{args.dcn_axis}={args.nodes}'] if args.nodes > 1 else []) + args.trainer_args


def train_argv(python: str, args) -> list[str]:
  """What the sbatch scripts' srun line runs in every task."""
  return [
    python,
    '-m',
    'neobert_jax.train',
    f'--config={args.config}',
    f'--workdir={args.workdir}',
    *trainer_flags(args),
  ]


def submit_env(args) -> dict[str, str]:
  """What the sbatch script reads from the submitting shell (sbatch passes the environment on to srun)."""
  return {'WORKDIR': args.workdir, 'CONFIG': args.config, 'NEOBERT_COORDINATOR_PORT': str(args.port)}


def sbatch_argv(args) -> list[str]:
  tasks = 1 if args.layout == 'node' else args.gpus_per_node
  return [
    'sbatch',
    f'--nodes={args.nodes}',
    f'--gpus-per-node={args.gpus_per_node}',
    f'--ntasks-per-node={tasks}',
    os.path.relpath(os.path.join(HERE, SCRIPTS[args.layout])),
    *trainer_flags(args),
  ]


def workers(args) -> list[tuple[str, dict[str, str], list[str]]]:
  """(host, environment, argv) of every task, in SLURM_PROCID order (srun's default block distribution)."""
  tasks = 1 if args.layout == 'node' else args.gpus_per_node
  hosts = [f'{args.host_prefix}{i:03d}' for i in range(1, args.nodes + 1)]
  nodelist = hosts[0] if args.nodes == 1 else f'{args.host_prefix}[001-{args.nodes:03d}]'  # SLURM's compressed form
  base = {
    **script_defaults(SCRIPTS[args.layout]),
    **submit_env(args),
    'SLURM_JOB_ID': str(args.job_id),
    'SLURM_JOB_NODELIST': nodelist,
    'SLURM_STEP_NODELIST': nodelist,
    'SLURM_JOB_NUM_NODES': str(args.nodes),
    'SLURM_STEP_NUM_NODES': str(args.nodes),
    'SLURM_NTASKS': str(args.nodes * tasks),
    # --gpus-per-node without a per-task binding: every task of a node sees all its GPUs
    'CUDA_VISIBLE_DEVICES': ','.join(map(str, range(args.gpus_per_node))),
  }
  argv = train_argv(os.path.join(args.repo, '.venv', 'bin', 'python'), args)
  return [
    (
      host,
      {
        **base,
        'SLURMD_NODENAME': host,
        'SLURM_NODEID': str(n),
        'SLURM_LOCALID': str(local),
        'SLURM_PROCID': str(n * tasks + local),
      },
      argv,
    )
    for n, host in enumerate(hosts)
    for local in range(tasks)
  ]


def parse_args(argv: list[str]):
  argv, trainer_args = (argv[: argv.index('--')], argv[argv.index('--') + 1 :]) if '--' in argv else (argv, [])
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--nodes', type=int, required=True)
  p.add_argument('--gpus-per-node', type=int, default=8)
  p.add_argument('--layout', choices=sorted(SCRIPTS), default='node', help='one process per node, or per GPU')
  p.add_argument('--workdir', required=True, help='run directory every node writes: gs://bucket/run or a shared path')
  p.add_argument('--config', default='configs/neobert_250m.py')
  p.add_argument(
    '--dcn-axis', choices=('data', 'fsdp'), default='data', help='mesh axis that spans the nodes (mesh.dcn_<axis>=N)'
  )
  p.add_argument('--port', type=int, default=6002, help='coordinator port on the first node')
  p.add_argument('--dry-run', action='store_true', help="print each process's command and environment")
  p.add_argument('--repo', default=os.getcwd(), help='dry run: the repository as the nodes see it (submit dir)')
  p.add_argument('--host-prefix', default='gpu', help='dry run: example host names <prefix>001, ...')
  p.add_argument('--job-id', type=int, default=1000, help='dry run: example SLURM job id')
  args = p.parse_args(argv)
  args.trainer_args = trainer_args
  if args.nodes < 1:
    p.error('--nodes must be at least 1')
  if args.layout == 'gpu' and args.gpus_per_node != GPU_LAYOUT_TASKS:
    p.error(f'--layout gpu: {SCRIPTS["gpu"]} starts {GPU_LAYOUT_TASKS} tasks per node')
  return args


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  env = submit_env(args)
  print(' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items()), shlex.join(sbatch_argv(args)))
  if not args.dry_run:
    return subprocess.run(sbatch_argv(args), env={**os.environ, **env}).returncode
  for host, task_env, argv in workers(args):
    print(f'# process {task_env["SLURM_PROCID"]}: {host}, local rank {task_env["SLURM_LOCALID"]}')
    for k, v in sorted(task_env.items()):
      print(f'    {k}={v}')
    print(f'    $ {shlex.join(argv)}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
