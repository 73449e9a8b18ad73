"""Loading, validating and resolving training configs, before anything expensive runs.

Every check here fails with a message that names the field and the fix: unknown keys (typos), a mesh that does
not use exactly the available devices, batch sizes that do not split over micro-batches / devices / processes,
and values outside what the trainer supports. The vocabulary-vs-tokenizer check needs the prepared data's
manifest, so the loop runs it (via the data pipeline's open_prepared) right after these, still before the model.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import jax
import ml_collections

from neobert_jax import config as schema
from neobert_jax import paths
from neobert_jax import sharding as shd
from neobert_jax.data.config import validate_data_config
from neobert_jax.errors import ConfigError
from neobert_jax.model.config import resolve_dtype, validate_model_config

# The checkout's root, for tests and tools that run from a source tree; nothing in the package reads it.
REPO_ROOT = Path(__file__).resolve().parents[2]
NAN_POLICIES = ('stop', 'skip')
# model.dtype values the trainer runs: float16 would need loss scaling, which it does not do.
TRAIN_DTYPES = ('auto', 'float32', 'bfloat16')


def base_config() -> ml_collections.ConfigDict:
  """The schema every run config must fit (neobert_jax/config/base.py)."""
  return schema.get_config()


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """A config file's get_config() with overrides (for tests and tools; the CLI uses ml_collections' config_flags).

  overrides: {'optimizer.peak_lr': 3e-4, ...}; a key that does not exist is a ConfigError.
  """
  return schema.load(path, overrides)


def _unknown_keys(cfg: Any, schema: Any, prefix: str = '') -> list[str]:
  bad = []
  for key in cfg.keys():
    name = f'{prefix}{key}'
    if key not in schema:
      bad.append(name)
    elif isinstance(cfg[key], ml_collections.ConfigDict) and isinstance(schema[key], ml_collections.ConfigDict):
      bad += _unknown_keys(cfg[key], schema[key], name + '.')
  return bad


def reject_unknown_keys(cfg: Any, schema_cfg: Any, where: str) -> None:
  """ConfigError for keys the schema lacks; a renamed field (schema.RENAMED) is named with its new home."""
  unknown = _unknown_keys(cfg, schema_cfg)
  for key in unknown:
    if key in schema.RENAMED:
      raise schema.unknown_key(key)
  if unknown:
    raise ConfigError(f'unknown config keys {unknown}; every field must exist in the schema, {where} (check the '
                      'spelling, or add the field there with its documentation)')


def _mesh_layout(cfg: ml_collections.ConfigDict, num_devices: int | None = None) -> shd.MeshLayout:
  n = jax.device_count() if num_devices is None else num_devices
  try:
    return shd.resolve_layout(dict(cfg.mesh), n)
  except ValueError as e:
    raise ConfigError(f'mesh: {e}') from None


def mesh_shape(cfg: ml_collections.ConfigDict, num_devices: int | None = None) -> dict[str, int]:
  """The mesh section with -1 filled in, as written to config.json: per-slice sizes, plus the dcn_* sizes
  where the config has them (with none, per-slice sizes are the mesh's sizes)."""
  layout = _mesh_layout(cfg, num_devices)
  return {k: v for k, v in layout.as_config().items() if k in shd.MESH_AXES or k in cfg.mesh}


def validate(cfg: ml_collections.ConfigDict, num_devices: int | None = None,
             process_count: int | None = None) -> None:
  """Raises ConfigError for a config this trainer cannot run on the current devices."""
  reject_unknown_keys(cfg, base_config(), 'neobert_jax/config/base.py')
  for section, check in (('model', validate_model_config), ('data', validate_data_config)):
    try:
      check(cfg[section])
    except ValueError as e:
      raise ConfigError(str(e)) from None
  t = cfg.train
  if t.nan_policy not in NAN_POLICIES:
    raise ConfigError(f'train.nan_policy={t.nan_policy!r}; expected one of {NAN_POLICIES}')
  if cfg.model.dtype not in TRAIN_DTYPES:
    raise ConfigError(f'model.dtype={cfg.model.dtype!r}; the trainer runs {TRAIN_DTYPES} (float16 would need loss '
                      'scaling: use bfloat16)')
  for field in ('num_steps', 'global_batch_size', 'grad_accum_steps'):
    if t[field] < 1:
      raise ConfigError(f'train.{field}={t[field]} must be >= 1')
  _validate_optimizer(cfg.optimizer, int(t.num_steps))
  if cfg.data.max_predictions > cfg.model.max_length:
    raise ConfigError(f'data.max_predictions={cfg.data.max_predictions} exceeds the sequence length '
                      f'model.max_length={cfg.model.max_length}')
  if cfg.init.from_checkpoint and cfg.init.from_hf:
    raise ConfigError('set at most one of init.from_checkpoint and init.from_hf')
  if cfg.checkpoint.keep < 1 or cfg.checkpoint.every_steps < 1:
    raise ConfigError('checkpoint.keep and checkpoint.every_steps must be >= 1')
  if cfg.eval.every_steps < 0 or cfg.eval.num_batches < 1:
    raise ConfigError(f'eval.every_steps={cfg.eval.every_steps} must be >= 0 (0 disables evaluation) and '
                      f'eval.num_batches={cfg.eval.num_batches} >= 1')
  if cfg.logging.log_every < 1 or cfg.logging.peak_flops_per_device < 0:
    raise ConfigError('logging.log_every must be >= 1 and logging.peak_flops_per_device >= 0 (0: look it up)')

  layout = _mesh_layout(cfg, num_devices)
  shape = dict(zip(shd.MESH_AXES, layout.shape))   # totals: what the batch is split over
  nproc = jax.process_count() if process_count is None else process_count
  if layout.num_granules > 1 and nproc > 1 and nproc % layout.num_granules:
    raise ConfigError(f'mesh.dcn_data x mesh.dcn_fsdp = {layout.num_granules} slices / nodes, but the {nproc} '
                      'processes do not split evenly over them (each slice or node runs whole processes)')
  gb, accum = t.global_batch_size, t.grad_accum_steps
  if gb % accum:
    raise ConfigError(f'train.global_batch_size={gb} is not divisible by train.grad_accum_steps={accum}')
  micro = gb // accum
  shards = shape['data'] * shape['fsdp']
  if micro % shards:
    raise ConfigError(
        f'the micro-batch of {micro} rows (global_batch_size {gb} / grad_accum_steps {accum}) does not split '
        f'over the mesh\'s batch axes data x fsdp = {shape["data"]} x {shape["fsdp"]} = {shards}; make it a '
        f'multiple of {shards}')
  if micro % nproc:
    raise ConfigError(f'the micro-batch of {micro} rows does not split over {nproc} processes')


def _validate_optimizer(o: ml_collections.ConfigDict, num_steps: int) -> None:
  """The optimizer values that cannot train: each refused with its field, its value and the range it needs."""
  ranges = (('peak_lr', o.peak_lr > 0, '> 0'), ('b1', 0 <= o.b1 < 1, 'in [0, 1)'), ('b2', 0 <= o.b2 < 1, 'in [0, 1)'),
            ('eps', o.eps > 0, '> 0'), ('weight_decay', o.weight_decay >= 0, '>= 0'),
            ('clip_norm', o.clip_norm >= 0, '>= 0 (0 disables clipping)'), ('clip_eps', o.clip_eps >= 0, '>= 0'),
            ('warmup_steps', o.warmup_steps >= 0, '>= 0'),
            ('warmup_init_fraction', 0 <= o.warmup_init_fraction <= 1, 'in [0, 1]'),
            ('decay_fraction', 0 < o.decay_fraction <= 1, 'in (0, 1]'), ('decay_steps', o.decay_steps >= 0, '>= 0'),
            ('final_lr_fraction', 0 <= o.final_lr_fraction <= 1,
             'in [0, 1] (the floor is final_lr_fraction x peak_lr and may not exceed the peak)'))
  for field, ok, needed in ranges:
    if not ok:
      raise ConfigError(f'optimizer.{field}={o[field]} must be {needed}')
  if o.warmup_steps > num_steps:
    raise ConfigError(f'optimizer.warmup_steps={o.warmup_steps} is longer than the run (train.num_steps={num_steps}): '
                      'the learning rate would never reach its peak. Lower the warmup or raise num_steps.')
  if o.decay_steps > 0 and o.decay_steps <= o.warmup_steps:
    raise ConfigError(f'optimizer.decay_steps={o.decay_steps} is an absolute step and must exceed '
                      f'optimizer.warmup_steps={o.warmup_steps} (the original trainer asserts the same)')


def resolve(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy with the run-time choices filled in (compute dtype, mesh sizes, attention kernel), as written to
  config.json."""
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.model.dtype = resolve_dtype(cfg.model.dtype)
  out.mesh = ml_collections.ConfigDict(mesh_shape(cfg))
  choice = attention_choice(out)
  out.model.attention_impl = choice.kernel
  if jax.process_index() == 0:
    logging.getLogger(__name__).info('attention kernel: %s', choice.describe())
    if choice.warning:
      logging.getLogger(__name__).warning('attention: %s', choice.warning)
  return out


def attention_choice(cfg: ml_collections.ConfigDict, platform: str | None = None,
                     compute_capability: str | None = None) -> Any:
  """The attention kernel this run uses (model/attention/select.py's table) for `platform` (default: this
  process's backend); raises ConfigError when an explicit model.attention_impl cannot run there."""
  from neobert_jax.model.attention import choose  # pylint: disable=g-import-not-at-top
  if platform is None:
    platform = jax.default_backend()
    if platform == 'gpu':
      compute_capability = getattr(jax.devices()[0], 'compute_capability', None)
  try:
    return choose(cfg.model.attention_impl, platform=platform, dtype=cfg.model.dtype,
                  packed=cfg.data.packing == 'packed', seq_len=int(cfg.model.max_length),
                  compute_capability=compute_capability, splash_block=int(cfg.model.splash_block_size),
                  blockwise_block=int(cfg.model.blockwise_block_size))
  except ValueError as e:
    raise ConfigError(str(e)) from None


def write(cfg: ml_collections.ConfigDict, workdir: str | Path) -> Path:
  """WORKDIR/config.json (process 0 writes; every process may call)."""
  path = paths.resolve(workdir, '--workdir') / 'config.json'
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text(path, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + '\n')
  return path


def tokens_per_step(cfg: ml_collections.ConfigDict) -> int:
  return int(cfg.train.global_batch_size) * int(cfg.model.max_length)


def describe(cfg: ml_collections.ConfigDict) -> str:
  """One line for the log: the run's shape at a glance."""
  m = cfg.model
  return (f'{m.num_layers}x{m.hidden_size} model, vocab {m.vocab_size}, seq {m.max_length}, '
          f'global batch {cfg.train.global_batch_size} ({cfg.train.grad_accum_steps} micro), '
          f'{tokens_per_step(cfg):,} tokens/step, {cfg.train.num_steps:,} steps, mesh {dict(cfg.mesh)}, '
          f'compute {m.dtype}, attention {m.attention_impl}; {math.prod(dict(cfg.mesh).values())} devices')
