"""Training configs: the schema (base.py) and loading a recipe file by path.

Recipes are plain files passed by path (configs/*.py in a checkout, or a file anywhere), never imported as a
package, so nothing depends on the working directory or on sys.path. A recipe that builds on another one loads it by
path, relative to itself:

    from pathlib import Path
    from neobert_jax import config

    def get_config():
      cfg = config.load(Path(__file__).with_name('neobert_250m.py'))

Owns: the schema and recipe loading. Imports the model and data config defaults only, never train/ or convert/.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import ml_collections

from neobert_jax.config.base import RENAMED, get_config
from neobert_jax.errors import ConfigError

__all__ = ['RENAMED', 'get_config', 'load', 'unknown_key']


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """A recipe file's get_config(), with overrides {'optimizer.peak_lr': 3e-4, ...} applied.

  A missing file or an override key that does not exist is a ConfigError.
  """
  path = Path(path)
  if not path.is_file():
    raise ConfigError(f'no config file {path}; pass a recipe such as configs/tiny_cpu.py')
  spec = importlib.util.spec_from_file_location(f'_neobert_cfg_{path.stem}', path)
  if spec is None or spec.loader is None:
    raise ConfigError(f'cannot load config file {path}')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
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


def unknown_key(key: str) -> ConfigError:
  """The error for an override of a field the schema lacks; a renamed one (RENAMED) names its new home."""
  if key in RENAMED:
    return ConfigError(f'{key} is now {RENAMED[key]}: set --config.{RENAMED[key]}=... (cfg.{RENAMED[key]} in a '
                       'recipe) instead')
  return ConfigError(f'unknown config key {key!r}')
