"""Ahead-of-time compile of the real train step for a TPU slice or an H100 cluster, from a CPU-only machine; what it
prints, every flag and the exit statuses: docs/performance.md, "Will it fit, and which layout is fastest?".

The optional dependency (libtpu, or the jax CUDA plugin + cuDNN) is installed on first use (aot/deps.py), and the
work runs in a child interpreter that sees it, with JAX_PLATFORMS=cpu: the target devices are compile-only."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from absl import flags
from ml_collections import config_flags

from neobert_jax import commandline, errors
from neobert_jax import config as config_lib
from neobert_jax.aot import deps, targets
from neobert_jax.config import data as data_config

_CHILD_ENV = 'NEOBERT_AOT_CHILD'
_FLAGS = flags.FlagValues()  # this command's own, as train's: several commands can be imported in one process
_OWN = {'flag_values': _FLAGS}  # every flag below is defined on _FLAGS; docs/performance.md explains each at length

_CONFIG = config_flags.DEFINE_config_file('config', None, 'training config (configs/*.py)', lock_config=False, **_OWN)
_TARGET = flags.DEFINE_string('target', None, 'tpu:v5e-256, tpu:v4-32, tpu:v5e:4x4, cuda:h100x8, ...', **_OWN)
_WHAT = flags.DEFINE_enum('what', 'train', ['train', 'forward_backward'], 'train step, or loss and gradients', **_OWN)
_HEADROOM = flags.DEFINE_float('headroom', 0.9, 'fraction of device memory the step may use and still "fit"', **_OWN)
_JSON = flags.DEFINE_string('json', None, 'also write the report as JSON to this file', **_OWN)
_DUMP_HLO = flags.DEFINE_string('dump_hlo', None, 'write the compiled (optimised, partitioned) HLO text here', **_OWN)
_REQUIRE_FIT = flags.DEFINE_bool('require_fit', False, 'exit with status 4 if the step does not fit', **_OWN)
_REQUIRE_CUDNN = flags.DEFINE_bool('require_cudnn', False, 'exit with status 5 if attention is not cuDNN fused', **_OWN)
_COST_MODEL = flags.DEFINE_bool('cost_model', False, "TPU targets: also report XLA's cost model of the step", **_OWN)
_PLAN = flags.DEFINE_bool('plan', False, 'find the fastest layout of this global batch that fits', **_OWN)
_PLAN_MFU = flags.DEFINE_float('plan_mfu', 0.5, 'MFU at which TPU estimates price splash attention', **_OWN)
_PLAN_WORKERS = flags.DEFINE_integer('plan_workers', 0, 'plan compile processes (0: one per two cores)', **_OWN)
_PLAN_REMAT = flags.DEFINE_list('plan_remat', ['none', 'save_dots', 'full'], 'remat policies the plan tries', **_OWN)
_PLAN_TENSOR = flags.DEFINE_list('plan_tensor', ['1', '2'], 'tensor-parallel sizes the plan tries', **_OWN)
_PLAN_MESH = flags.DEFINE_list('plan_mesh', ['fsdp', 'data'], 'batch-axis layouts the plan tries: fsdp, data', **_OWN)


def run_child(cfg_in) -> int:
  from neobert_jax.aot import report as report_lib
  from neobert_jax.config import train as train_config
  from neobert_jax.data import mixture

  target = targets.parse_target(_TARGET.value)
  targets.start_backends(target)
  try:
    # On the real hardware 'auto' settings resolve from jax.default_backend(); here that is the CPU, so the
    # trainer's own resolution (config/train.resolve_train, the same table) runs for the target's platform and devices.
    cfg, choice = train_config.resolve_train(
      train_config.typed_train(cfg_in),
      train_config.DataFacts(mixture=mixture.read(cfg_in.data.mixture).record() if cfg_in.data.mixture else ''),
      platform=target.platform,
      compute_capability=target.chip.compute_capability,
      num_devices=target.num_devices,
    )
    if _PLAN.value:
      return run_plan(cfg, target)
    r, hlo = report_lib.compile_report(cfg, target, _WHAT.value, _HEADROOM.value)
  except errors.ConfigError as e:
    raise errors.ConfigError(f'for {target.spec}: {errors.one_line(e)}') from e
  r.notes[:0] = [f'attention kernel {choice.describe()}'] + ([choice.warning] if choice.warning else [])
  if _DUMP_HLO.value and hlo:
    Path(_DUMP_HLO.value).write_text(hlo)
  if _COST_MODEL.value and target.platform == 'tpu':
    from neobert_jax.aot import plan as plan_lib

    r.cost_model_seconds = plan_lib.tpu_seconds(cfg, target, _PLAN_MFU.value)
    r.cost_model_splash_mfu = _PLAN_MFU.value
    if r.cost_model_seconds is None:
      r.notes.append(
        '--cost_model: this XLA gave no cost analysis (optimal_seconds) for the TPU program; '
        'the roofline above is the estimate'
      )
  elif _COST_MODEL.value:
    r.notes.append('--cost_model: XLA gives a cost model for TPU targets only; the roofline above is the estimate')
  print(report_lib.format_report(r), flush=True)
  if _JSON.value:
    extra = dict(what=_WHAT.value, attention_impl=cfg.model.attention_impl, dtype=cfg.model.dtype)
    extra.update(packing=cfg.data.packing, max_predictions=cfg.data.max_predictions)
    Path(_JSON.value).write_text(json.dumps(r.as_dict() | extra, indent=2))
  if _REQUIRE_FIT.value and not r.fits:
    return 4
  if _REQUIRE_CUDNN.value and not r.uses_cudnn_attention:
    return 5
  return 0


def run_plan(cfg, target: targets.Target) -> int:
  from neobert_jax.aot import plan as plan_lib

  t0 = time.time()
  rows = plan_lib.plan_layouts(
    cfg,
    target,
    mfu=_PLAN_MFU.value,
    headroom=_HEADROOM.value,
    remats=tuple(_PLAN_REMAT.value),
    tensor_sizes=tuple(int(t) for t in _PLAN_TENSOR.value),
    layouts=tuple(_PLAN_MESH.value),
    workers=_PLAN_WORKERS.value,
  )
  tokens = cfg.train.global_batch_size * cfg.model.max_length
  print(
    f'plan for {target.spec}: global batch {cfg.train.global_batch_size} x {cfg.model.max_length} = '
    f'{tokens:,} tokens/step, attention {cfg.model.attention_impl}, {len(rows)} layouts '
    f'({time.time() - t0:.0f} s of compiles)'
  )
  print(plan_lib.format_plan_table(rows, target))
  if target.platform != 'tpu':
    print(
      'estimated step time is the roofline of each compiled step (aot/roofline.py: kernels at the achievable '
      'rates of neobert_jax/hardware.py, communication with the stated overlap): a model, not a measurement'
    )
  best = plan_lib.recommend(rows)
  if _JSON.value:
    best_dict = dataclasses.asdict(best) if best else None
    data = {'rows': [dataclasses.asdict(r) for r in rows], 'best': best_dict, 'overrides': best and best.overrides()}
    Path(_JSON.value).write_text(json.dumps(data, indent=2))
  if best is None:
    print('no layout fits: reduce the global batch or the sequence length, or use more devices')
    return 4
  print('recommended: ' + ' '.join(best.overrides()))
  return 0


def check_mixture(cfg) -> str | None:
  """A mixture refused as training refuses it (its file, its sources' manifests), before any compile or download;
  no shard is read. Returns a note when the sources cannot be reached from here: the compile needs no data."""
  from neobert_jax.data.pipeline import prepared  # pylint: disable=g-import-not-at-top

  if not cfg.data.mixture:
    return None
  data_config.validate_data_config(cfg.data)
  try:
    prepared.open_data(cfg.data, cfg.model.max_length, cfg.model.vocab_size)
  except errors.StorageError as e:
    return f'data.mixture: the sources were not checked ({errors.one_line(e)})'
  return None


def main(argv: list[str]) -> int:
  del argv  # run() refuses positional arguments
  if os.environ.get(_CHILD_ENV) == '1':
    return run_child(_CONFIG.value)
  target = targets.parse_target(_TARGET.value)  # fail on a bad target before any download
  if note := check_mixture(_CONFIG.value):  # a mixture the trainer would refuse is refused here, before any download
    print(f'[aot] {note}', file=sys.stderr)
  try:
    deps.ensure(target.platform)
  except deps.DependencyError as e:
    print(f'[aot] cannot compile for {target.spec}: optional dependency missing.\n{e}', file=sys.stderr)
    return 3
  env = deps.child_env(target.platform) | {_CHILD_ENV: '1'}
  # The child finds neobert_jax where this process did: installed (pip install [-e] .), or the working directory.
  return subprocess.call([sys.executable, '-m', 'neobert_jax.compile'] + sys.argv[1:], env=env)


def run() -> None:
  """The command line (neobert_jax/commandline.py); the compile child, started with the same flags, runs it too."""
  commandline.run_absl(
    'compile',
    'neobert_jax.compile',
    __doc__,
    _FLAGS,
    main,
    required=('config', 'target'),
    fields_doc='neobert_jax/config/train.py',
    renamed=lambda key: config_lib.unknown_key(key) if key in config_lib.RENAMED else None,
  )


if __name__ == '__main__':
  run()
