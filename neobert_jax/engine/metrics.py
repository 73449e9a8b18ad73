"""Throughput accounting (device peaks for MFU) and the metric sinks (metrics.jsonl, TensorBoard, wandb)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from neobert_jax import errors, hardware, paths
from neobert_jax.weights.runs import METRICS_FILE


def measure_matmul_peak(n: int = 1024, dtype: Any = jnp.float32, seconds: float = 1.0) -> float:
  """Achieved FLOP/s of a square matmul on the default device (the CPU's usable peak, all cores together)."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  reps, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds or reps < 3:
    f(a).block_until_ready()
    reps += 1
  return 2 * n**3 * reps / (time.perf_counter() - start)


def total_peak_flops(peak_flops_per_device: float, compute_dtype: str) -> tuple[float | None, str]:
  """(peak FLOP/s of all devices, its source): the config's, the device table's, or a CPU matmul measured."""
  n = jax.device_count()
  if peak_flops_per_device > 0:
    return peak_flops_per_device * n, 'config'
  kind = jax.devices()[0].device_kind
  peak = hardware.peak_flops(kind)
  if peak is not None:
    return peak * n, f'table ({kind})'
  if jax.default_backend() == 'cpu':
    # Fake CPU devices share the same cores, so the host's matmul rate is the whole run's peak.
    dtype = jnp.bfloat16 if compute_dtype == 'bfloat16' else jnp.float32
    return cpu_matmul_peak(dtype) * jax.process_count(), 'measured matmul, best on this CPU'
  return None, f'unknown device {kind}'


def cpu_matmul_peak(dtype: Any) -> float:
  """The best matmul rate measured on this CPU and core count (cached), so MFU stays below 100% after a loaded start."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
  except OSError:
    names = []
  key = f'{names[0] if names else platform.processor() or platform.machine()} | '
  key += f'{len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()} cores'
  key += f' | {jnp.dtype(dtype).name}'
  cache = paths.cache_dir('hardware') / 'cpu_matmul_peak.json'
  try:
    known = json.loads(cache.read_text()) if cache.is_file() else {}
  except ValueError:
    known = {}
  best = max(measure_matmul_peak(dtype=dtype), float(known.get(key, 0.0)))
  if best > known.get(key, 0.0):
    known[key] = best
    paths.write_text(paths.resolve(str(cache)), json.dumps(known, indent=2, sort_keys=True) + '\n')
  return best


# Records of another prefix than train/eval go to a file of their own, so metrics.jsonl stays one line per logged
# step: checkpoint/* (save and upload seconds and retries of each checkpoint, engine/session.py).
FILES = {'checkpoint': 'checkpoint_metrics.jsonl'}
DEFAULT_WANDB_PROJECT = 'neobert-jax'
WANDB_MODES = ('online', 'offline', 'disabled')


@dataclasses.dataclass(frozen=True)
class Wandb:
  """A W&B run (logging.wandb); its id is kept in WORKDIR/wandb/run_id, so a resumed run logs on into it."""

  project: str
  name: str = ''
  tags: tuple[str, ...] = ()
  config: dict[str, Any] | None = None
  mode: str = 'online'

  @classmethod
  def from_settings(cls, project: str, name: str, tags: str, mode: str, config: dict[str, Any]) -> 'Wandb':
    return cls(
      project or os.environ.get('WANDB_PROJECT') or DEFAULT_WANDB_PROJECT,
      name,
      tuple(t.strip() for t in tags.split(',') if t.strip()),
      config,
      mode or os.environ.get('WANDB_MODE') or 'online',
    )


def check_wandb(options: Wandb) -> None:
  """errors.ConfigError before anything is written: no wandb, a bad mode, or online with no API key (a prompt)."""
  if importlib.util.find_spec('wandb') is None:
    raise errors.ConfigError(
      'logging.wandb=True needs the wandb package: pip install -e .[wandb] (or set logging.wandb=False)'
    )
  if options.mode not in WANDB_MODES:
    raise errors.ConfigError(
      f'wandb mode {options.mode!r} (logging.wandb_mode, else WANDB_MODE): expected one of {WANDB_MODES}'
    )
  if options.mode == 'online' and not _wandb_key():
    raise errors.ConfigError(
      'logging.wandb=True logs online, but no W&B API key is set: run `wandb login` (or set WANDB_API_KEY), or set '
      'WANDB_MODE=offline to keep the run on disk, or set logging.wandb=False'
    )


def _wandb_key() -> str:
  """The API key wandb would use: WANDB_API_KEY, else the one `wandb login` saved in ~/.netrc."""
  if os.environ.get('WANDB_API_KEY'):
    return os.environ['WANDB_API_KEY']
  import netrc  # pylint: disable=g-import-not-at-top

  host = os.environ.get('WANDB_BASE_URL', 'https://api.wandb.ai').split('://')[-1].split('/')[0].split(':')[0]
  try:
    entry = netrc.netrc(os.environ.get('NETRC')).authenticators(host)
  except (OSError, netrc.NetrcParseError):
    return ''
  return entry[2] if entry and entry[2] else ''


def _start_wandb(options: Wandb, local: Path) -> Any:
  """The wandb run of this workdir, resumed by the id in WORKDIR/wandb/run_id."""
  import wandb  # pylint: disable=g-import-not-at-top

  where = local / 'wandb'
  id_file = where / 'run_id'
  run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
  own_dir = not os.environ.get('WANDB_DIR')
  fresh = not where.exists()
  if own_dir:
    where.mkdir(parents=True, exist_ok=True)
  try:
    run = wandb.init(
      project=options.project,
      name=options.name or None,
      tags=list(options.tags) or None,
      config=options.config,
      id=run_id,
      resume='allow',
      mode=options.mode,
      dir=str(local) if own_dir else None,  # None: wandb reads WANDB_DIR itself
    )
  except Exception as e:  # noqa: BLE001 - wandb raises its own types for a missing login, a network down, ...
    if fresh:  # what wandb wrote there before it gave up (its logs) must not be left in the run
      shutil.rmtree(where, ignore_errors=True)
    raise errors.ConfigError(
      f'logging.wandb=True: wandb could not start a run ({errors.one_line(e)}); run `wandb login`, or set '
      'WANDB_MODE=offline to keep the run on disk, or set logging.wandb=False'
    ) from None
  where.mkdir(parents=True, exist_ok=True)
  id_file.write_text(run_id + '\n')
  run.define_metric('*', step_metric='step')  # checkpoint/* arrive after later train steps: no global step order
  return run


class MetricsWriter:
  """Scalars to metrics.jsonl, TensorBoard and wandb on process 0; a bucket workdir writes a mirror."""

  def __init__(
    self,
    workdir: str | os.PathLike,
    tensorboard: bool = True,
    wandb: Wandb | None = None,
    on_storage_error: Callable[[OSError], BaseException] | None = None,
  ):
    self.active = jax.process_index() == 0
    # A write that fails (a full disk) becomes the caller's one-line error, which can name what is kept.
    self._on_storage_error = on_storage_error
    self._jsonl, self._files, self._tb, self._wandb = None, {}, None, None
    if not self.active:
      return
    remote = paths.resolved(workdir, '--workdir')
    self.mirror = paths.Mirror(remote, paths.cache_dir('mirror', paths.url_key(remote)))
    self.mirror.pull((METRICS_FILE, *FILES.values()))
    local = self.mirror.path
    if wandb is not None:  # first: a wandb that cannot start is one line, with no metrics file opened
      self._wandb = _start_wandb(wandb, local)
    local.mkdir(parents=True, exist_ok=True)
    self._jsonl = open(local / METRICS_FILE, 'a', buffering=1)  # line-buffered: readable while training
    if tensorboard:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(str(local / 'tensorboard'))

  @property
  def local_dir(self) -> Path | None:
    """Where this process may write growing run outputs (a profile trace), uploaded by `sync`."""
    return self.mirror.path if self.active else None

  def sync(self) -> None:
    """Makes everything written so far visible in the workdir (a no-op for a local one)."""
    if not self.active:
      return
    if self._tb is not None:
      self._tb.flush()
    self.mirror.sync()

  def write(self, step: int, scalars: Mapping[str, float], prefix: str = 'train') -> None:
    if not self.active:
      return
    # 'time' (unix seconds) puts the curves on a wall-clock axis (train/report.py's loss_curve.png)
    row = {'step': int(step), 'time': round(time.time(), 3), **{f'{prefix}/{k}': float(v) for k, v in scalars.items()}}
    try:
      if prefix in FILES and prefix not in self._files:
        self._files[prefix] = open(self.mirror.path / FILES[prefix], 'a', buffering=1)
      self._files.get(prefix, self._jsonl).write(json.dumps(row) + '\n')
      if self._tb is not None:
        for k, v in scalars.items():
          self._tb.add_scalar(f'{prefix}/{k}', float(v), int(step))
    except OSError as e:
      if self._on_storage_error is None or isinstance(e, errors.NeobertError):
        raise
      raise self._on_storage_error(e) from e
    if self._wandb is not None:
      self._wandb.log(row)

  def close(self) -> None:
    for f in (self._jsonl, *self._files.values()):
      if f is not None:
        f.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()
    self._jsonl, self._files, self._tb, self._wandb = None, {}, None, None
    self.sync()
