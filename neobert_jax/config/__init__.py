"""The one home of configs: the sections with their defaults, types and validation, and loading a recipe by path.

Each field keeps the type of its default; `typed` applies that rule to a whole config once, at the boundary, so
nothing past it casts a config value. Recipes are files passed by path, never imported as a package, so nothing
depends on the working directory. Imports errors, paths, sharding and jax only."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import ml_collections

from neobert_jax.errors import ConfigError

__all__ = ['RENAMED', 'check_choices', 'check_ranges', 'from_record', 'load', 'replace', 'typed', 'unknown_key']

# Fields that moved: a config (file or --config.* override) that still sets the old name is told the new one.
RENAMED = {'train.compute_dtype': 'model.dtype'}


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """A recipe file's get_config() (`path` may end in ':ARG', as --config does), with dotted overrides applied."""
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
  """`cfg` fitted to `schema` (a fresh get_config()): every field of the schema's type, missing fields at their
  defaults; an unknown key or a value of another type is a ConfigError (an int where a float is due converts)."""
  unknown: list[str] = []
  _fit(cfg, schema, '', unknown)
  if moved := [key for key in unknown if key in RENAMED]:
    raise unknown_key(moved[0])
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


# Validation as data: each section's checks are tables of these, refused with one message shape per kind of check.
Range = tuple[str, bool, str]  # (field, whether its value is in range, the range in words)


def check_ranges(section: str, values: ml_collections.ConfigDict, ranges: Iterable[Range]) -> None:
  """Raises ConfigError naming the first field of `section` whose value is out of its range."""
  for field, ok, needed in ranges:
    if not ok:
      raise ConfigError(f'{section}.{field}={values[field]} must be {needed}')


def check_choices(
  section: str, values: ml_collections.ConfigDict, choices: Iterable[tuple[str, Sequence[str]]]
) -> None:
  """Raises ConfigError naming the first field of `section` whose value is none of its allowed values."""
  for field, allowed in choices:
    if values[field] not in allowed:
      raise ConfigError(f'{section}.{field}={values[field]!r} is unknown; set one of {", ".join(allowed)}')
