"""Multi-process start-up: one call to `initialize()`, early, in every process; the first source that matches wins:
NEOBERT_* variables, SLURM (a process per node or per GPU), a Cloud TPU VM, else one process. No job hangs on a dead
process: the heartbeat timeout is ours, and an uncaught exception exits at once, skipping the shutdown barrier."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import traceback

import jax

from neobert_jax import errors, jax_compat

log = logging.getLogger(__name__)

# Environment variables read here (all optional). Documented in launch/README.md.
ENV_COORDINATOR = 'NEOBERT_COORDINATOR'  # host:port of process 0
ENV_NUM_PROCESSES = 'NEOBERT_NUM_PROCESSES'
ENV_PROCESS_ID = 'NEOBERT_PROCESS_ID'
ENV_LOCAL_DEVICE_IDS = 'NEOBERT_LOCAL_DEVICE_IDS'  # "0,1" or "all"
ENV_NUM_CPU_DEVICES = 'NEOBERT_NUM_CPU_DEVICES'  # fake CPU devices per process (tests, debugging)
ENV_HEARTBEAT = 'NEOBERT_HEARTBEAT_TIMEOUT'  # seconds
ENV_SHUTDOWN = 'NEOBERT_SHUTDOWN_TIMEOUT'  # seconds
ENV_INIT = 'NEOBERT_INIT_TIMEOUT'  # seconds
ENV_DISABLE = 'NEOBERT_DISTRIBUTED'  # "0" forces single-process mode
ENV_COORDINATOR_PORT = 'NEOBERT_COORDINATOR_PORT'  # SLURM: port override

# A dead peer is noticed within a minute; jax's own default is 100 s. The shutdown timeout bounds how long
# a process that finished waits for slower peers at the very end (e.g. a last checkpoint being written).
DEFAULT_HEARTBEAT_S = 60
DEFAULT_SHUTDOWN_S = 300
DEFAULT_INIT_S = 300


@dataclasses.dataclass(frozen=True)
class DistributedInfo:
  process_id: int
  num_processes: int
  method: str  # 'env' | 'slurm' | 'tpu' | 'single'
  coordinator_address: str | None = None
  local_device_ids: tuple[int, ...] | None = None

  @property
  def is_primary(self) -> bool:
    return self.process_id == 0


_INFO: DistributedInfo | None = None


def _env_int(name: str) -> int | None:
  value = os.environ.get(name, '').strip()
  return int(value) if value else None


def _slurm_settings() -> tuple[str, int, int, tuple[int, ...] | None] | None:
  """(coordinator, num_processes, process_id, local_device_ids) inside a multi-task srun step, else None."""
  env = os.environ
  # SLURM_STEP_NODELIST only exists inside an srun step; the bare sbatch script is not a distributed job.
  if not all(k in env for k in ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID')):
    return None
  ntasks = int(env['SLURM_NTASKS'])
  if ntasks <= 1:
    return None
  port = env.get(ENV_COORDINATOR_PORT) or env.get('JAX_COORDINATOR_PORT')
  coordinator = jax_compat.slurm_coordinator_address(port)
  nodes = int(env.get('SLURM_STEP_NUM_NODES') or env.get('SLURM_JOB_NUM_NODES') or env.get('SLURM_NNODES') or 1)
  tasks_per_node = max(1, ntasks // max(nodes, 1))
  # jax's own SLURM detection always pins a process to GPU number SLURM_LOCALID, which silently leaves 7 of
  # 8 GPUs idle when one process drives a whole node (anchors.md, MaxText #3433). Decide from the layout:
  visible = [v for v in env.get('CUDA_VISIBLE_DEVICES', '').split(',') if v.strip()]
  if tasks_per_node == 1 or len(visible) == 1:
    local = None  # all visible GPUs (a node per process, or SLURM already bound one GPU per task)
  else:
    local = (int(env.get('SLURM_LOCALID', '0')),)  # one process per GPU, all GPUs visible to every task
  return coordinator, ntasks, int(env['SLURM_PROCID']), local


def _on_tpu_vm() -> bool:
  return jax_compat.num_tpu_chips() > 0


def _fail_fast_excepthook(exc_type, exc, tb):
  """Print the error and leave now, skipping the shutdown barrier, so peers abort within the heartbeat timeout."""
  pid = _INFO.process_id if _INFO else '?'
  sys.stderr.write(
    f'[neobert_jax.distributed] process {pid}: uncaught exception, exiting without '
    'shutdown barrier so the other processes stop too.\n'
  )
  traceback.print_exception(exc_type, exc, tb)
  sys.stdout.flush()
  sys.stderr.flush()
  logging.shutdown()
  os._exit(1)


def initialize(num_cpu_devices: int | None = None) -> DistributedInfo:
  """Starts jax.distributed for a multi-process job (idempotent), before any backend is touched."""
  global _INFO
  if _INFO is not None:
    return _INFO

  ncpu = num_cpu_devices if num_cpu_devices is not None else _env_int(ENV_NUM_CPU_DEVICES)
  if ncpu:
    jax.config.update('jax_num_cpu_devices', int(ncpu))

  method, coord, nproc, pid, local_device_ids = 'single', None, None, None, None
  if os.environ.get(ENV_DISABLE, '1') == '0':
    pass
  elif os.environ.get(ENV_NUM_PROCESSES) or os.environ.get(ENV_COORDINATOR):
    coord, nproc, pid = (os.environ.get(ENV_COORDINATOR), _env_int(ENV_NUM_PROCESSES), _env_int(ENV_PROCESS_ID))
    if nproc is None or pid is None or (coord is None and nproc > 1):
      raise errors.DistributedError(
        f'multi-process start needs coordinator address, process count and process id; got '
        f'coordinator={coord!r} num_processes={nproc!r} process_id={pid!r} '
        f'(flags or {ENV_COORDINATOR}/{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID})'
      )
    method = 'single' if nproc == 1 else 'env'
  elif (slurm := _slurm_settings()) is not None:
    method = 'slurm'
    coord, nproc, pid, local_device_ids = slurm
  elif _on_tpu_vm():
    method = 'tpu'
  ids = os.environ.get(ENV_LOCAL_DEVICE_IDS, '').strip()
  if method in ('env', 'slurm') and local_device_ids is None and ids not in ('', 'all'):
    local_device_ids = tuple(int(v) for v in ids.split(',') if v.strip())

  if method == 'single':
    _INFO = DistributedInfo(process_id=0, num_processes=1, method='single')
    return _INFO

  # Gloo gives the CPU backend cross-process collectives (the fake-device tests); GPU/TPU ignore it.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  timeouts = dict(
    initialization_timeout=_env_int(ENV_INIT) or DEFAULT_INIT_S,
    heartbeat_timeout_seconds=_env_int(ENV_HEARTBEAT) or DEFAULT_HEARTBEAT_S,
    shutdown_timeout_seconds=_env_int(ENV_SHUTDOWN) or DEFAULT_SHUTDOWN_S,
  )
  if method == 'tpu':
    try:
      jax.distributed.initialize(**timeouts)
    except ValueError as e:  # a lone TPU VM without pod metadata: nothing to coordinate
      log.info('TPU VM without multi-host metadata (%s); running single-process', e)
      _INFO = DistributedInfo(process_id=0, num_processes=1, method='single')
      return _INFO
    nproc, pid = jax.process_count(), jax.process_index()
  else:
    # 'deactivate' stops jax from second-guessing what we resolved (notably its SLURM one-GPU pinning).
    jax.distributed.initialize(
      coordinator_address=coord,
      num_processes=int(nproc),
      process_id=int(pid),
      local_device_ids=None if local_device_ids is None else list(local_device_ids),
      cluster_detection_method='deactivate',
      **timeouts,
    )
  sys.excepthook = _fail_fast_excepthook
  _INFO = DistributedInfo(int(pid), int(nproc), method, coord, local_device_ids)
  log.info('jax.distributed up: %s', _INFO)
  return _INFO


def is_primary() -> bool:
  """True on process 0, the only process that writes logs, metrics and exports."""
  return jax.process_index() == 0
