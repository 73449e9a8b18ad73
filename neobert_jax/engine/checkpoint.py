"""Orbax checkpoints of a training run: writing a step, and reading one back (resume, a new stage) in
weights/runs.py's layout. What a resume does with a step that does not fit or cannot be read: docs/configuration.md."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Protocol

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from neobert_jax import bucket, errors, paths
from neobert_jax.engine.state import TrainState
from neobert_jax.weights import runs
from neobert_jax.weights.flat import check_keys_and_shapes, path_key

log = logging.getLogger(__name__)


class DataPosition(Protocol):
  """Where a run's data stands, saved with every resumable step; the engine never reads inside it."""

  def save_arg(self) -> Any:
    """The Orbax argument that writes the position, captured now."""

  def restore(self, item: paths.Path, step: int) -> bool:
    """Moves the data to the position in `item` after `step` steps; True if exact, False if approximated."""


def make_manager(
  workdir: str | os.PathLike, keep: int = 3, async_save: bool = True, on_saved: Callable[[], None] | None = None
) -> ocp.CheckpointManager:
  """The run's manager; on_saved() runs in Orbax's thread once a background save has committed."""
  directory = paths.resolved(workdir, '--workdir') / runs.CHECKPOINT_SUBDIR
  runs.use_bucket_budget()
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep,
    save_interval_steps=1,  # the loop decides when to save; Orbax just obeys
    enable_async_checkpointing=async_save,
    create=True,
    async_options=ocp.AsyncOptions(
      timeout_secs=int(2 * bucket.window_s() + 60),
      post_finalization_callback=on_saved if async_save else None,  # Orbax refuses one on a blocking save
      create_directories_asynchronously=False,
    ),
  )
  return ocp.CheckpointManager(directory, options=options)


def save(
  mngr: ocp.CheckpointManager,
  step: int,
  state: TrainState,
  position: DataPosition | None,
  cfg: ml_collections.ConfigDict,
  *,
  with_optimizer: bool = True,
  last_good: int | None = None,
) -> None:
  """Starts saving `state` as `step`; the data position is captured now, with the parameters."""
  args = {runs.PARAMS_ITEM: ocp.args.StandardSave(nnx.to_pure_dict(state['params']))}
  if with_optimizer:
    args[runs.OPT_ITEM] = ocp.args.StandardSave(state['opt'])
    if 'ema' in state:
      args[runs.EMA_ITEM] = ocp.args.StandardSave(nnx.to_pure_dict(state['ema']))
  args[runs.CONFIG_ITEM] = ocp.args.JsonSave(cfg.to_dict())
  if position is not None:
    args[runs.DATA_ITEM] = position.save_arg()
  try:
    # An earlier async save that failed in the background raises here, at the next save.
    mngr.save(step, args=ocp.args.Composite(**args), force=True)
  except Exception as e:  # noqa: BLE001 - every failure of a save is the storage's; --debug shows the cause
    raise save_failed(mngr, e, last_good) from e


def finish(mngr: ocp.CheckpointManager, last_good: int | None = None) -> None:
  """Waits for the saves in flight; a failed one is errors.StorageError (one line), like in `save`."""
  try:
    mngr.wait_until_finished()
  except Exception as e:  # noqa: BLE001
    raise save_failed(mngr, e, last_good) from e


def close(mngr: ocp.CheckpointManager) -> None:
  """Closes the manager; after a failed save Orbax raises the same failure again, which must not replace it."""
  try:
    mngr.close()
  except Exception as e:  # noqa: BLE001
    log.debug('closing the checkpoint manager after a failure: %s', errors.one_line(e, first=True, with_type=True))


# What a write failure says, in the words users search for; Orbax and tensorstore wrap them in long specs.
_WRITE_REASONS = (
  'No space left on device',
  'Read-only file system',
  'Permission denied',
  'Disk quota exceeded',
  'PERMISSION_DENIED',  # a bucket's codes
  'RESOURCE_EXHAUSTED',
  'UNAVAILABLE',
  'DEADLINE_EXCEEDED',
)


def kept(mngr: ocp.CheckpointManager, good: int | None) -> str:
  """What a failed write leaves: the last complete checkpoint, `good`, or none."""
  if good is None:
    return 'no checkpoint of this run was complete yet'
  return f'the last complete checkpoint, {mngr.directory}/{good}, is kept'


def save_failed(mngr: ocp.CheckpointManager, e: BaseException, last_good: int | None = None) -> errors.StorageError:
  """The one line for a failed save, naming the last complete checkpoint (`last_good`, else the newest listed)."""
  text = f'{type(e).__name__}: {e}'
  reason = (
    next((r for r in _WRITE_REASONS if r in text), None)
    or errors.one_line(e, first=True, with_type=True).split(' [tensorstore_spec')[0]
  )
  if not paths.local(paths.Path(mngr.directory)):
    bucket.gave_up()  # the run stops now: what it still sends to the bucket is tried once, not for a window
  good = last_good
  if good is None:
    with contextlib.suppress(Exception):  # the storage is down: say what is known
      good = runs.latest_step(paths.Path(mngr.directory))
  return errors.StorageError(
    f'writing a checkpoint under {mngr.directory} failed ({reason}); {kept(mngr, good)}. Free space '
    'or fix the storage, then re-run the same command to resume from it.'
  )


# A local disk's read error that lasts this long is not going away (permissions, a dead mount): fail in seconds,
# not the bucket's retry window.
LOCAL_READ_WINDOW_S = 6.0


def _read(read: Callable[[], Any], step: int, directory: Any) -> Any:
  """read() on the bucket's retry budget; a storage error that outlasts it is errors.CheckpointError."""
  try:
    window = None if paths.is_url(str(directory)) else min(LOCAL_READ_WINDOW_S, bucket.window_s())
    return bucket.retry(read, f'reading checkpoint step {step}', window)
  except Exception as e:  # noqa: BLE001 - sorted by is_transient
    if not bucket.is_transient(e):
      raise
    raise errors.CheckpointError(
      f'checkpoint step {step} in {directory} could not be read within the retry window because of a storage '
      f'error ({errors.one_line(e, first=True, with_type=True)}). It was left in place; re-run once the storage is reachable to resume from it.'
    ) from e


def _items(abstract: TrainState) -> tuple[str, ...]:
  """The items of a step that hold `abstract`'s arrays."""
  return (runs.PARAMS_ITEM, runs.OPT_ITEM) + ((runs.EMA_ITEM,) if 'ema' in abstract else ())


def _pure(abstract: TrainState, item: str) -> Any:
  return abstract['opt'] if item == runs.OPT_ITEM else nnx.to_pure_dict(abstract[item])


def _leaves(tree: Any) -> dict[str, Any]:
  # Orbax's metadata tree spells every node as a dict key ('1', 'value'); the abstract state uses sequence
  # indices and attributes. Their names agree.
  return {path_key(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _check_fits(
  directory: paths.Path, step: int, abstract: TrainState, items: tuple[str, ...] = (), fix: str = ''
) -> None:
  """errors.ConfigError when the saved `items` (default: params, opt) do not fit `abstract`; metadata only."""
  root = runs.step_dir(directory, step)
  for item in items or (runs.PARAMS_ITEM, runs.OPT_ITEM):
    handler = ocp.StandardCheckpointHandler()
    with runs.item_metadata_quietly():
      saved = _read(lambda: handler.metadata(root / item), step, directory)
    check_keys_and_shapes(
      _leaves(getattr(saved, 'tree', saved)),
      {k: v.shape for k, v in _leaves(_pure(abstract, item)).items()},
      f'checkpoint step {step} in {directory} ({item})',
      fix
      or 'this config builds a different state than the one saved (see the config differences above, if any); '
      "nothing was changed. Resume with the run's own config, or start a new --workdir (with "
      '--config.init.from_checkpoint to start from its weights).',
      error=errors.ConfigError,
    )


def _agree_on_step(step: int | None, directory: Any) -> None:
  """Every process must resume from the same step, or the first collective would hang."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  steps = np.asarray(multihost_utils.process_allgather(np.int64(-1 if step is None else step))).reshape(-1)
  if len(set(steps.tolist())) > 1:
    raise RuntimeError(
      f'processes restored different checkpoint steps {steps.tolist()} (-1: none) from '
      f'{directory}; check that every process sees the same checkpoint directory'
    )


def restore_latest(
  mngr: ocp.CheckpointManager, abstract: TrainState, position: DataPosition | None
) -> tuple[int, TrainState] | None:
  """The newest readable step onto `abstract`'s shardings (any mesh), `position` restored from it; or None."""
  directory = paths.Path(mngr.directory)
  for step in sorted(runs.checkpoint_steps(directory), reverse=True):
    try:
      _check_fits(directory, step, abstract)
      args = ocp.args.Composite(**{item: ocp.args.StandardRestore(_pure(abstract, item)) for item in _items(abstract)})
      restored = _read(lambda: mngr.restore(step, args=args), step, mngr.directory)  # onto abstract's shardings
    except (errors.CheckpointError, errors.ConfigError):
      raise
    except Exception as e:  # noqa: BLE001 - the bytes are damaged or missing: try the previous checkpoint
      runs.set_aside(directory, step, f'could not be restored ({errors.one_line(e, first=True, with_type=True)})')
      mngr.reload()
      continue
    _agree_on_step(step, mngr.directory)
    if position is not None:
      position.restore(runs.step_dir(directory, step) / runs.DATA_ITEM, step)
    state = {'opt': restored[runs.OPT_ITEM]}
    for item in set(_items(abstract)) - {runs.OPT_ITEM}:
      state[item] = jax.tree.map(lambda a: a, abstract[item])
      nnx.replace_by_pure_dict(state[item], restored[item])
    return step, state
  _agree_on_step(None, mngr.directory)
  return None


def restore_stage(
  directory: paths.Path, step: int, abstract: TrainState, position: DataPosition | None, *, optimizer: bool, data: bool
) -> Any:
  """A new stage's carry-over from `step` of another run: its optimizer state (returned, else None), data position."""
  opt = None
  if optimizer:
    if not (runs.step_dir(directory, step) / runs.OPT_ITEM).is_dir():
      raise errors.ConfigError(
        f'init.keep_optimizer=True: step {step} in {directory} holds no optimizer state (a fine-tuning run keeps '
        'none); set init.keep_optimizer=False to start the optimizer afresh'
      )
    fix = 'its optimizer state does not fit the one this config builds (clipping switched on or off?); set '
    fix += 'init.keep_optimizer=False to start the optimizer afresh'
    _check_fits(directory, step, abstract, (runs.OPT_ITEM,), fix)
    opt = _read(lambda: runs.restore_opt_tree(directory, step, abstract['opt']), step, directory)
  if data and position is not None:
    position.restore(runs.step_dir(directory, step) / runs.DATA_ITEM, step)
  return opt
