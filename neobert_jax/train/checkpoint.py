"""Orbax checkpoints of a training run, and how to read them back (for resume, stage 2, and HF export).

On-disk layout (one Orbax CheckpointManager rooted at WORKDIR/checkpoints):

  WORKDIR/config.json                    the resolved training config (model/data/train/... sections)
  WORKDIR/checkpoints/<step>/params      nested dict of the model's parameters, e.g.
                                         params['encoder']['layers']['qkv'] [L, D, H, 3*Dh]; joining the keys with
                                         '.' gives exactly neobert_jax.model.params.to_flat's keys
  WORKDIR/checkpoints/<step>/opt         the nnx.Optimizer state (step counter, optax AdamW moments mu/nu)
  WORKDIR/checkpoints/<step>/data        the Grain iterator position (one JSON per process), if the run had one
  WORKDIR/checkpoints/<step>/config      a copy of the resolved config, so a step directory stands alone

<step> is the number of optimizer steps already taken. Orbax writes each step into a temporary directory and
renames it only after every item (and every process) has committed, so a crash mid-save leaves the previous
steps intact and the half-written one is never listed. A step that is listed but cannot be read (disk damage,
files removed by hand) is reported, moved aside as '<step>.corrupt', and the next older step is used.

For converters: `restore_params(path)` returns (model config, flat numpy params) on one CPU, whatever mesh wrote it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from neobert_jax.train.state import TrainState

log = logging.getLogger(__name__)

CHECKPOINT_SUBDIR = 'checkpoints'


def checkpoint_dir(path: str | os.PathLike) -> Path:
  """Accepts a workdir (with a checkpoints/ subdir) or the checkpoints dir itself."""
  p = Path(path).expanduser().resolve()
  return p / CHECKPOINT_SUBDIR if (p / CHECKPOINT_SUBDIR).is_dir() else p


def make_manager(workdir: str | os.PathLike, keep: int = 3, async_save: bool = True) -> ocp.CheckpointManager:
  directory = Path(workdir).expanduser().resolve() / CHECKPOINT_SUBDIR
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, save_interval_steps=1,  # the loop decides when to save; Orbax just obeys
      enable_async_checkpointing=async_save, create=True)
  return ocp.CheckpointManager(directory, options=options)


def _data_args(data_iter: Any, save: bool) -> dict[str, Any]:
  if data_iter is None or not hasattr(data_iter, 'get_state'):
    return {}
  import grain  # imported here so that readers of params-only (converters) need not load grain
  return {'data': grain.checkpoint.CheckpointSave(data_iter) if save else grain.checkpoint.CheckpointRestore(data_iter)}


def save(mngr: ocp.CheckpointManager, step: int, state: TrainState, data_iter: Any,
         cfg: ml_collections.ConfigDict) -> None:
  """Starts saving `state` as `step` (arrays are written in the background when async); returns at once.

  The Grain iterator's position is captured synchronously here, so it matches exactly the batches the saved
  parameters have seen even while the arrays are still being written.
  """
  args = {'params': ocp.args.StandardSave(nnx.to_pure_dict(state['params'])),
          'opt': ocp.args.StandardSave(state['opt']),
          'config': ocp.args.JsonSave(cfg.to_dict()),
          **_data_args(data_iter, save=True)}
  mngr.save(step, args=ocp.args.Composite(**args), force=True)


def _set_aside(mngr: ocp.CheckpointManager, step: int) -> None:
  """Renames an unreadable step so it is neither retried nor overwritten by a later save of the same number."""
  src = Path(mngr.directory) / str(step)
  if jax.process_index() == 0 and src.exists():
    dst = src.with_name(f'{step}.corrupt')
    n = 1
    while dst.exists():
      dst, n = src.with_name(f'{step}.corrupt{n}'), n + 1
    src.rename(dst)
    log.warning('moved unreadable checkpoint %s to %s', src, dst)
  mngr.reload()


def restore_latest(mngr: ocp.CheckpointManager, abstract: TrainState, data_iter: Any) -> tuple[int, TrainState] | None:
  """Restores the newest readable step onto the shardings in `abstract` (any mesh); None if there is none.

  `data_iter` (if any) is moved in place to the saved position. Unreadable steps are reported and set aside.
  """
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(nnx.to_pure_dict(abstract['params'])),
          opt=ocp.args.StandardRestore(abstract['opt']),
          **_data_args(data_iter, save=False)))
    except Exception as e:  # noqa: BLE001 - any failure to read means: try the previous checkpoint
      older = [s for s in mngr.all_steps() if s < step]
      log.warning('checkpoint step %d in %s could not be restored (%s: %s); %s', step, mngr.directory,
                  type(e).__name__, str(e).splitlines()[0] if str(e) else '',
                  f'falling back to step {max(older)}' if older else 'no older checkpoint is left')
      _set_aside(mngr, step)
      continue
    params = jax.tree.map(lambda a: a, abstract['params'])
    nnx.replace_by_pure_dict(params, restored['params'])
    return step, {'params': params, 'opt': restored['opt']}
  return None


def _flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    key = f'{prefix}{k}'
    out.update(_flatten(v, key + '.') if isinstance(v, dict) else {key: v})
  return out


def latest_step(ckpt_dir: str | os.PathLike) -> int | None:
  steps = ocp.utils.checkpoint_steps(checkpoint_dir(ckpt_dir))
  return max(steps) if steps else None


def read_config(path: str | os.PathLike, step: int | None = None) -> ml_collections.ConfigDict:
  """The resolved training config saved with `step` (default latest), else the workdir's config.json."""
  cdir = checkpoint_dir(path)
  step = latest_step(cdir) if step is None else step
  candidates = []
  if step is not None:
    candidates.append(cdir / str(step) / 'config' / 'metadata')
  candidates += [cdir.parent / 'config.json', cdir / 'config.json']
  for c in candidates:
    if c.is_file():
      return ml_collections.ConfigDict(json.loads(c.read_text()))
  raise FileNotFoundError(f'no training config found for {path} (looked at {", ".join(map(str, candidates))})')


def restore_params(path: str | os.PathLike, step: int | None = None) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """(model config, {dotted key: numpy array}) of a checkpoint, read on one CPU device whatever mesh wrote it.

  `path` is a workdir, its checkpoints/ dir; `step` defaults to the latest complete step.
  """
  cdir = checkpoint_dir(path)
  step = latest_step(cdir) if step is None else step
  if step is None:
    raise FileNotFoundError(f'no complete checkpoint under {cdir}')
  item = cdir / str(step) / 'params'
  if not item.is_dir():
    raise FileNotFoundError(f'checkpoint step {step} has no params at {item}')
  cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend='cpu')[0])
  with ocp.StandardCheckpointer() as ckptr:
    meta = ckptr.metadata(item).item_metadata
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu), meta.tree)
    tree = ckptr.restore(item, target)
  flat = {k: np.asarray(v) for k, v in _flatten(tree).items()}
  return read_config(cdir, step).model, flat
