"""Throughput accounting (device peaks for MFU) and the metric sinks (TensorBoard, metrics.jsonl).

MFU = model FLOPs actually needed per second / peak FLOP/s of the devices. The FLOPs per token are the task's
(pretraining's: train/mlm.flops_per_token, on model/sizes.py's formula), handed to the Logger
(engine/trainer.LogOptions); padding tokens are not counted as work done.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from neobert_jax import errors, hardware, paths


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
  """(peak FLOP/s of all devices in the run, where the number came from): logging.peak_flops_per_device when > 0,
  else the device table (or, on CPU, a matmul measured in the resolved model.dtype)."""
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
    return measure_matmul_peak(dtype=dtype) * jax.process_count(), 'measured matmul'
  return None, f'unknown device {kind}'


# Records of another prefix than train/eval go to a file of their own, so metrics.jsonl stays one line per logged
# step: checkpoint/* (save and upload seconds and retries of each checkpoint, engine/session.py).
FILES = {'checkpoint': 'checkpoint_metrics.jsonl'}
METRICS_FILE = 'metrics.jsonl'


@dataclasses.dataclass(frozen=True)
class Wandb:
  """Where a run's metrics also go when logging.wandb is on: a Weights & Biases run of `project`, named `name`
  ('' = wandb's choice), with `tags`, holding `config`. WANDB_MODE=offline keeps it on disk (WORKDIR/wandb)."""

  project: str
  name: str = ''
  tags: tuple[str, ...] = ()
  config: dict[str, Any] | None = None


def check_wandb() -> None:
  """errors.ConfigError (one line) when logging.wandb is on and the wandb package is missing."""
  if importlib.util.find_spec('wandb') is None:
    raise errors.ConfigError(
      'logging.wandb=True needs the wandb package: pip install -e .[wandb] (or set logging.wandb=False)'
    )


def _start_wandb(options: Wandb, local: Path) -> Any:
  """The wandb run of this workdir: its id is kept in WORKDIR/wandb/run_id, so a resumed run logs on into it."""
  import wandb  # pylint: disable=g-import-not-at-top

  where = local / 'wandb'
  where.mkdir(parents=True, exist_ok=True)
  id_file = where / 'run_id'
  run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
  id_file.write_text(run_id + '\n')
  try:
    run = wandb.init(
      project=options.project,
      name=options.name or None,
      tags=list(options.tags) or None,
      config=options.config,
      id=run_id,
      resume='allow',
      dir=str(local),
    )
  except Exception as e:  # noqa: BLE001 - wandb raises its own types for a missing login, a network down, ...
    raise errors.ConfigError(
      f'logging.wandb=True: wandb could not start a run ({errors.one_line(e)}); run `wandb login`, or set '
      'WANDB_MODE=offline to keep the run on disk, or set logging.wandb=False'
    ) from None
  run.define_metric('*', step_metric='step')  # checkpoint/* arrive after later train steps: no global step order
  return run


class MetricsWriter:
  """Writes scalars to WORKDIR/metrics.jsonl (checkpoint/* to WORKDIR/checkpoint_metrics.jsonl), TensorBoard
  event files and, with `wandb`, a Weights & Biases run (process 0 only; others no-op).

  On a bucket workdir they live in a local mirror (objects cannot be appended to) that `sync` uploads: the loop
  syncs with every checkpoint and at the end, and a resumed run first pulls its jsonl files back.
  """

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
    self._jsonl = None
    self._files: dict[str, Any] = {}
    self._tb = None
    self._wandb = None
    if not self.active:
      return
    remote = paths.resolve(workdir, '--workdir')
    self.mirror = paths.Mirror(remote, paths.cache_dir('mirror', paths.url_key(remote)))
    self.mirror.pull((METRICS_FILE, *FILES.values()))
    local = self.mirror.path
    local.mkdir(parents=True, exist_ok=True)
    self._jsonl = open(local / METRICS_FILE, 'a', buffering=1)  # line-buffered: readable while training
    if tensorboard:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(str(local / 'tensorboard'))
    if wandb is not None:
      self._wandb = _start_wandb(wandb, local)

  @property
  def local_dir(self) -> Path | None:
    """Where this process may write run outputs that grow (a profile trace), uploaded by `sync`."""
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
    record = {
      'step': int(step),
      'time': round(time.time(), 3),
      **{f'{prefix}/{k}': float(v) for k, v in scalars.items()},
    }
    try:
      if prefix in FILES and prefix not in self._files:
        self._files[prefix] = open(self.mirror.path / FILES[prefix], 'a', buffering=1)
      self._files.get(prefix, self._jsonl).write(json.dumps(record) + '\n')
      if self._tb is not None:
        for k, v in scalars.items():
          self._tb.add_scalar(f'{prefix}/{k}', float(v), int(step))
    except OSError as e:
      if self._on_storage_error is None or isinstance(e, errors.NeobertError):
        raise
      raise self._on_storage_error(e) from e
    if self._wandb is not None:
      self._wandb.log(record)

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    for f in self._files.values():
      f.close()
    self._files = {}
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None
    self.sync()
