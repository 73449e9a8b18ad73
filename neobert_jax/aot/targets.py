"""Compile targets (tpu:v5e-256, tpu:v5e:16x16, tpu:2xv5p-256, cuda:h100x8, ...: docs/performance.md, `--target`)
and their compile-only devices (jax.experimental.topologies), in the child interpreter aot/deps.py sets up."""

import dataclasses
import math
import re

from neobert_jax import hardware

from neobert_jax.errors import ConfigError  # a bad --target is the user's to fix: one line, status 2

GIB = 1024**3

# The H100 SXM 80GB as XLA's GpuTargetConfigProto wants it (the figures of XLA's h100_sxm spec): what the GPU
# compiler needs to choose kernels and to check the cuDNN fused-attention requirements (compute capability 9.0,
# cuDNN >= 9) without a device.
H100_SXM_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 threads_per_core_limit: 2048
  shared_memory_per_block: 49152 shared_memory_per_core: 233472 shared_memory_per_block_optin: 232448
  core_count: 132 fpus_per_core: 128 registers_per_core_limit: 65536 registers_per_block_limit: 65536
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  thread_dim_limit_x: 1024 thread_dim_limit_y: 1024 thread_dim_limit_z: 64
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98 device_memory_size: 84942979072
  cuda_compute_capability { major: 9 minor: 0 }
  device_vendor: "NVIDIA Corporation" device_address_bits: 64 name: "NVIDIA H100 80GB HBM3"
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  memory_bytes: int  # per device (a TPU chip in one-device-per-chip mode, or a GPU)
  dims: int = 2  # TPU torus rank
  chip_config: str = 'default'
  cores_per_chip_in_name: int = 1  # v4-8 / v5p-8 name TensorCores, not chips
  compute_capability: str | None = None  # NVIDIA GPUs: decides the cuDNN kernels available (packed layout: 9.0+)


CHIPS = {
  'h100': Chip('H100 SXM 80GB', 84942979072, compute_capability='9.0'),
  # v4 and v5p have two TensorCores per chip that jax drives as one device ("megacore").
  'v4': Chip('TPU v4', 32 * GIB, dims=3, chip_config='megacore', cores_per_chip_in_name=2),
  'v5p': Chip('TPU v5p', 95 * GIB, dims=3, chip_config='megacore', cores_per_chip_in_name=2),
  'v5e': Chip('TPU v5 lite', 16 * GIB),
  'v6e': Chip('TPU v6 lite', 32 * GIB),
}


@dataclasses.dataclass(frozen=True)
class Target:
  spec: str  # as given on the command line
  platform: str  # 'tpu' | 'cuda'
  chip: Chip
  num_devices: int
  tpu_topology: str | None = None  # e.g. 'v5e:16x16', one slice's grid
  num_slices: int = 1  # TPU slices over the data-centre network (num_devices counts them all)
  gpu_hosts: int | None = None
  gpus_per_host: int | None = None

  @property
  def peak_bf16_flops(self) -> float:  # dense, per device (hardware.py)
    return hardware.lookup(self.chip.name).peak_bf16_flops

  @property
  def dcn_bandwidth(self) -> float | None:  # bytes/s per device to another slice / node (hardware.py)
    return hardware.lookup(self.chip.name).dcn_bytes_per_s

  @property
  def num_granules(self) -> int:
    """Slices (TPU) or hosts (GPU) the target spans: the groups joined by the data-centre network."""
    return self.num_slices if self.platform == 'tpu' else (self.gpu_hosts or 1)


def start_backends(target: Target) -> None:
  """Initialises the backends of a compiling process: plugin discovery preloads the pip cuDNN library, which the
  cuDNN attention checks at trace time need."""
  import jax  # pylint: disable=g-import-not-at-top

  jax.devices()
  if target.platform == 'cuda':
    from neobert_jax import jax_compat  # pylint: disable=g-import-not-at-top

    jax_compat.cudnn_assume_compute_capability(target.chip.compute_capability)


def _grid(chips: int, dims: int) -> tuple[int, ...]:
  """Google's chip grid for a slice: the smallest axis doubles first (ties: the later one), so v5e-32 = 4x8
  and 3-D grids grow 2x2x1, 2x2x2, 2x2x4, 2x4x4, ..."""
  grid = [1, 1] if dims == 2 else [2, 2, 1]  # a 3-D slice is at least one 2x2x1 host
  if chips & (chips - 1) or chips < math.prod(grid):
    least = '' if dims == 2 else ' of at least 4'
    raise ConfigError(f'{chips} chips: {dims}-D TPU slices have a power-of-two chip count{least}')
  while math.prod(grid) < chips:
    i = min(range(dims), key=lambda k: (grid[k], -k))
    grid[i] *= 2
  return tuple(grid)


def parse_target(spec: str) -> Target:
  platform, _, rest = spec.partition(':')
  platform = platform.lower()
  if platform == 'cuda' or platform == 'gpu':
    if not (m := re.fullmatch(r'(h100)x(\d+)', rest.lower())):
      raise ConfigError(f'GPU target {spec!r}: expected cuda:h100x<N> (only the H100 SXM description is built in)')
    n = int(m.group(2))
    per_host = min(n, 8)
    if n % per_host:
      raise ConfigError(f'{spec}: more than 8 GPUs must be a multiple of 8 (8 per host)')
    return Target(spec, 'cuda', CHIPS['h100'], n, gpu_hosts=n // per_host, gpus_per_host=per_host)
  if platform == 'tpu':
    if not (m := re.fullmatch(r'(?:(\d+)x)?(v4|v5e|v5p|v6e)([-:])([\dx]+)', rest.lower())):
      raise ConfigError(
        f'TPU target {spec!r}: expected e.g. tpu:v5e-256, tpu:v4-32, tpu:v5e:16x16 or tpu:2xv5p-256 (2 slices)'
      )
    slices, gen, sep, size = m.groups()
    slices = int(slices or 1)
    if slices < 1:
      raise ConfigError(f'{spec}: the number of slices must be >= 1')
    chip = CHIPS[gen]
    if sep == ':':
      grid = tuple(int(x) for x in size.split('x'))
      if len(grid) != chip.dims:
        raise ConfigError(f'{spec}: {gen} slices are {chip.dims}-D (e.g. {"2x2x2" if chip.dims == 3 else "4x4"})')
    else:
      cores = int(size)
      if cores % chip.cores_per_chip_in_name:
        raise ConfigError(f'{spec}: {gen}-N counts TensorCores ({chip.cores_per_chip_in_name} per chip)')
      grid = _grid(cores // chip.cores_per_chip_in_name, chip.dims)
    topo = f'{gen}:' + 'x'.join(map(str, grid))
    return Target(spec, 'tpu', chip, slices * math.prod(grid), tpu_topology=topo, num_slices=slices)
  raise ConfigError(f'unknown target platform in {spec!r}; expected tpu:... or cuda:...')


def devices(target: Target) -> list:
  """Compile-only devices of the target (needs the child environment from aot/deps.py)."""
  from jax.experimental import topologies

  if target.platform == 'tpu':
    grid = tuple(int(x) for x in target.tpu_topology.split(':')[1].split('x'))
    # Chips per host along each torus axis: 4 per TPU VM host in multi-host slices (v5e / v6e 2x2, v4 / v5p 2x2x1);
    # a slice smaller than a host is a single host holding all of it.
    bounds = tuple(min(b, g) for b, g in zip((2, 2, 1), grid + (1,) * (3 - len(grid))))
    topo = topologies.get_topology_desc(
      platform='tpu',
      topology_name=target.tpu_topology,
      chip_config_name=target.chip.chip_config,
      chips_per_host_bounds=bounds,
      num_slices=target.num_slices,
      wrap=(False,) * 3,
    )
  else:
    # 'partitions x hosts x devices per host'
    topo = topologies.get_topology_desc(
      platform='cuda', topology=f'1x{target.gpu_hosts}x{target.gpus_per_host}', target_config=H100_SXM_TARGET
    )
  devs = list(topo.devices)
  if len(devs) != target.num_devices:
    raise RuntimeError(f'{target.spec}: topology has {len(devs)} devices, expected {target.num_devices}')
  return devs
