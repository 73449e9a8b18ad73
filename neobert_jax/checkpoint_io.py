"""Parameter trees and run checkpoints at the lowest level: the layer that train/ and convert/ both build on.

Owns:
  * the flat layout, {dotted key: array} ('encoder.layers.qkv'), and the nested one ({'encoder': {'layers': ...}})
    that Orbax stores: `flatten` / `unflatten`;
  * the key/shape check every loader runs before touching a model (`check_keys_and_shapes`);
  * the on-disk layout of a run, WORKDIR/config.json and WORKDIR/checkpoints/<step>/{params,opt,data,config}
    (train/checkpoint.py writes it): `checkpoint_dir`, `latest_step`, `read_config`;
  * restoring a step's parameters: onto given shardings (`restore_param_tree`) or on one CPU device whatever mesh
    wrote them (`restore_params`, what converters and fine-tuning read).

Must not import anything of the package but errors: model/, data/, train/, convert/ and the commands import it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Mapping

import jax
import ml_collections
import numpy as np

from neobert_jax import errors, paths


def _orbax():
  # Imported on first use: model/params.py and model/hf_layout.py need only the key checks, and importing
  # them should not cost Orbax's import (~0.4 s).
  import orbax.checkpoint  # pylint: disable=g-import-not-at-top
  return orbax.checkpoint


CHECKPOINT_SUBDIR = 'checkpoints'
PARAMS_ITEM = 'params'
CONFIG_ITEM = 'config'  # the resolved config, saved with each step as an Orbax JSON item
CONFIG_FILE = 'config.json'  # the same config, written into the workdir when the run starts


def flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """Nested {name: {...: leaf}} -> {'name.….leaf': leaf}."""
  out: dict[str, Any] = {}
  for k, v in tree.items():
    key = f'{prefix}{k}'
    out.update(flatten(v, key + '.') if isinstance(v, Mapping) else {key: v})
  return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """Inverse of `flatten`."""
  out: dict[str, Any] = {}
  for key, value in flat.items():
    *parents, leaf = key.split('.')
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return out


def _preview(keys: list[str], limit: int = 6) -> str:
  shown = ', '.join(keys[:limit])
  return shown + (f', ... ({len(keys) - limit} more)' if len(keys) > limit else '')


def check_keys_and_shapes(got: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], what: str, fix: str,
                          error: Callable[[str], Exception] = errors.CheckpointError) -> None:
  """Raises `error` naming every missing and unexpected key and every wrong shape at once, before any is used."""
  missing = [k for k in expected if k not in got]
  unexpected = [k for k in got if k not in expected]
  problems = []
  if missing:
    problems.append(f'missing keys ({len(missing)}): {_preview(missing)}')
  if unexpected:
    problems.append(f'unexpected keys ({len(unexpected)}): {_preview(unexpected)}')
  for key, shape in expected.items():
    if key in got and tuple(np.shape(got[key])) != tuple(shape):
      problems.append(f'{key}: expected shape {tuple(shape)}, got {tuple(np.shape(got[key]))}')
  if problems:
    raise error(f'{what} does not match the model config:\n  ' + '\n  '.join(problems) + f'\nFix: {fix}')


def checkpoint_dir(path: str | os.PathLike) -> paths.Path:
  """Accepts a workdir (with a checkpoints/ subdir) or the checkpoints dir itself, local or on a bucket."""
  p = paths.resolve(path)
  return p / CHECKPOINT_SUBDIR if (p / CHECKPOINT_SUBDIR).is_dir() else p


def latest_step(path: str | os.PathLike) -> int | None:
  """The newest complete step (Orbax lists only finalised steps: a half-written one is never returned)."""
  steps = _orbax().utils.checkpoint_steps(checkpoint_dir(path))
  return max(steps) if steps else None


def read_config(path: str | os.PathLike, step: int | None = None) -> ml_collections.ConfigDict:
  """The resolved config saved with `step` (default: latest), else the workdir's config.json.

  The step's item is read through Orbax's JSON handler (the format `ocp.args.JsonSave` wrote), on this process
  alone: a Checkpointer would wait at a barrier for processes that may not be reading.
  """
  cdir = checkpoint_dir(path)
  step = latest_step(cdir) if step is None else step
  looked = []
  if step is not None:
    item = cdir / str(step) / CONFIG_ITEM
    looked.append(str(item))
    if item.is_dir():
      return ml_collections.ConfigDict(_orbax().JsonCheckpointHandler().restore(item))
  # Runs whose steps hold no config item (fine-tuning runs) record it in the workdir only.
  for c in (cdir.parent / CONFIG_FILE, cdir / CONFIG_FILE):
    looked.append(str(c))
    if c.is_file():
      return ml_collections.ConfigDict(json.loads(c.read_text()))
  raise FileNotFoundError(f'no training config found for {path} (looked at {", ".join(looked)})')


def _params_item(path: str | os.PathLike, step: int | None) -> tuple[paths.Path, int]:
  cdir = checkpoint_dir(path)
  step = latest_step(cdir) if step is None or step < 0 else step
  if step is None:
    raise FileNotFoundError(f'no complete checkpoint under {cdir}')
  item = cdir / str(step) / PARAMS_ITEM
  if not item.is_dir():
    raise FileNotFoundError(f'checkpoint step {step} has no params at {item}')
  return item, step


def restore_param_tree(path: str | os.PathLike, step: int | None, abstract: Any) -> tuple[Any, int]:
  """(nested params, step) of a run, read straight onto `abstract`'s shardings (ShapeDtypeStructs; no host
  gather). Every process must call it: Orbax reads collectively."""
  item, step = _params_item(path, step)
  with _orbax().StandardCheckpointer() as ckptr:
    return ckptr.restore(item, abstract), step


def restore_params(path: str | os.PathLike,
                   step: int | None = None) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """(model config, {dotted key: numpy array}) of a checkpoint, read on one CPU device whatever mesh wrote it.

  `path` is a workdir or its checkpoints/ dir; `step` defaults to the latest complete step. FileNotFoundError
  when there is none.
  """
  item, step = _params_item(path, step)
  cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend='cpu')[0])
  absl_log = logging.getLogger('absl')
  level = absl_log.level
  with _orbax().StandardCheckpointer() as ckptr:
    # The step-level metadata file sits one directory up (CheckpointManager layout); Orbax warns that the item
    # has none of its own, which is expected here and only alarms users reading the export log.
    absl_log.setLevel(logging.ERROR)
    try:
      meta = ckptr.metadata(item).item_metadata
    finally:
      absl_log.setLevel(level)
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu), meta.tree)
    tree = ckptr.restore(item, target)
  flat = {k: np.asarray(v) for k, v in flatten(tree).items()}
  return read_config(item.parent.parent, step).model, flat
