"""The one home of configs: the sections with their defaults, types and validation, and loading a recipe by path.

  model.py     the model section (architecture and numerics), what its 'auto' settings resolve to (compute dtype,
               the attention kernel table); model/ and the weights layer build on it
  data.py      the pretraining data section (the input pipeline's knobs); data/ builds on it
  train.py     the pretraining config: the whole schema (seed, model, data, mesh, train, optimizer, eval,
               checkpoint, init, logging, export), its cross-section validation, `resolve` (the run-time
               choices, for pretraining and compile), the mesh sizes, config.json
  finetune.py  the fine-tuning config (classification, regression, contrastive), its validation and `resolve`
  optimizer.py the range checks both optimizer sections share
  resume.py    what a resumed run may change, field by field

Types: every config is a ConfigDict built from its schema's get_config(), so each field keeps the type of its
default (ml_collections refuses a value of another type on assignment, from a recipe or --config.x.y=...).
`typed` applies the same rule to a whole config once, at the boundary (validate does it, and so does
`from_record` for a config.json read back), so nothing past it casts a config value.

Recipes are plain files passed by path (configs/*.py in a checkout, or a file anywhere), never imported as a
package, so nothing depends on the working directory or on sys.path. A recipe that builds on another one loads it by
path, relative to itself:

    from pathlib import Path
    from neobert_jax import config

    def get_config():
      cfg = config.load(Path(__file__).with_name('neobert_250m.py'))

Sits low: imports errors, paths, sharding (the mesh layout) and jax only, never model/, data/, train/ or above.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Mapping

import ml_collections

from neobert_jax.errors import ConfigError

__all__ = ['RENAMED', 'from_record', 'load', 'replace', 'typed', 'unknown_key']

# Fields that moved: a config (file or --config.* override) that still sets the old name is told the new one.
RENAMED = {'train.compute_dtype': 'model.dtype'}


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """A recipe file's get_config(), with overrides {'optimizer.peak_lr': 3e-4, ...} applied.

  `path` may name an argument of get_config after a colon, as --config does: 'configs/neobert_250m_stages.py:2'.
  A missing file or an override key that does not exist is a ConfigError.
  """
  args: tuple[str, ...] = ()
  if not Path(path).is_file() and ':' in Path(path).name:
    path, arg = str(path).rsplit(':', 1)
    args = (arg,)
  path = Path(path)
  if not path.is_file():
    raise ConfigError(f'no config file {path}; pass a recipe such as configs/tiny_cpu.py')
  spec = importlib.util.spec_from_file_location(f'_neobert_cfg_{path.stem}', path)
  if spec is None or spec.loader is None:
    raise ConfigError(f'cannot load config file {path}')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config(*args)
  for key, value in (overrides or {}).items():
    node = cfg
    *parents, leaf = key.split('.')
    for p in parents:
      if p not in node:
        raise unknown_key(key)
      node = node[p]
    if leaf not in node:
      raise unknown_key(key)
    node[leaf] = value
  return cfg


def replace(cfg: ml_collections.ConfigDict, fields: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A copy of `cfg` with `fields` ({'model.remat_policy': 'full', ...}) set: the one way code outside config/
  derives a config from another (tests/test_config_assignments.py refuses a field assigned anywhere else)."""
  out = ml_collections.ConfigDict(cfg.to_dict())
  for key, value in fields.items():
    *parents, leaf = key.split('.')
    node = out
    for p in parents:
      node = node[p]
    node[leaf] = value
  return out


def unknown_key(key: str) -> ConfigError:
  """The error for an override of a field the schema lacks; a renamed one (RENAMED) names its new home."""
  if key in RENAMED:
    return ConfigError(
      f'{key} is now {RENAMED[key]}: set --config.{RENAMED[key]}=... (cfg.{RENAMED[key]} in a recipe) instead'
    )
  return ConfigError(f'unknown config key {key!r}')


def _fit(cfg: Any, out: ml_collections.ConfigDict, prefix: str, unknown: list[str]) -> None:
  """Assigns cfg's values into `out` (a fresh schema), field by field; ml_collections keeps each field's type."""
  for key in cfg.keys():
    name = f'{prefix}{key}'
    if key not in out:
      unknown.append(name)
      continue
    value, default = cfg[key], out[key]
    if isinstance(default, ml_collections.ConfigDict):
      if not isinstance(value, (Mapping, ml_collections.ConfigDict)):
        raise ConfigError(f'{name} is a section of the config, not a value ({value!r})')
      _fit(value, default, name + '.', unknown)
      continue
    try:
      out[key] = value
    except TypeError:
      raise ConfigError(
        f'{name}={value!r} is a {type(value).__name__}; the field is a {type(default).__name__} '
        f'(its default is {default!r})'
      ) from None


def typed(cfg: Any, schema: ml_collections.ConfigDict, where: str) -> ml_collections.ConfigDict:
  """`cfg` fitted to `schema` (a fresh get_config()): every field of the schema's type, fields cfg lacks at their
  defaults. A key the schema lacks is a ConfigError (a renamed one names its new home; `where` names the schema's
  file), and so is a value of another type (an int where the schema has a float becomes that float)."""
  unknown: list[str] = []
  _fit(cfg, schema, '', unknown)
  for key in unknown:
    if key in RENAMED:
      raise unknown_key(key)
  if unknown:
    raise ConfigError(
      f'unknown config keys {unknown}; every field must exist in the schema, {where} (check the '
      'spelling, or add the field there with its documentation)'
    )
  return schema


def from_record(
  recorded: Mapping[str, Any] | ml_collections.ConfigDict, schema: ml_collections.ConfigDict
) -> ml_collections.ConfigDict:
  """A config read back from a run's config.json, typed by the current `schema` (a fresh get_config()): fields the
  record lacks (it predates them) take the schema's defaults and fields the schema no longer has are dropped."""
  _fit(recorded, schema, '', [])
  return schema
