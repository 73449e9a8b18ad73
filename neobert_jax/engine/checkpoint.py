"""Orbax checkpoints of a training run, and how to read them back (for resume, stage 2, and HF export).

On-disk layout (one Orbax CheckpointManager rooted at WORKDIR/checkpoints):

  WORKDIR/config.json                    the resolved training config (model/data/train/... sections)
  WORKDIR/checkpoints/<step>/params      nested dict of the model's parameters, e.g.
                                         params['encoder']['layers']['qkv'] [L, D, H, 3*Dh]; joining the keys with
                                         '.' gives exactly neobert_jax.weights.flat.to_flat's keys
  WORKDIR/checkpoints/<step>/opt         the nnx.Optimizer state (step counter, optax AdamW moments mu/nu)
  WORKDIR/checkpoints/<step>/ema         the moving average of the parameters, same layout (train.ema_decay > 0)
  WORKDIR/checkpoints/<step>/data        the Grain iterator position (one JSON per process), if the run had one
  WORKDIR/checkpoints/<step>/config      a copy of the resolved config, so a step directory stands alone

<step> is the number of optimizer steps already taken. Orbax writes each step into a temporary directory and
renames it only after every item (and every process) has committed, so a crash mid-save leaves the previous
steps intact and the half-written one is never listed. A step whose params or optimizer state cannot be read
(disk damage, files removed by hand) is reported loudly, moved aside as '<step>.corrupt', and the next older step
is used. A step is never set aside for anything else:
  * a readable step whose arrays do not fit the state this config builds (other shapes, another tree structure)
    is a config mismatch (errors.ConfigError, one line), checked from the small metadata files before any array is
    read; train/resume.py has refused the config differences that cause it even earlier;
  * an I/O error that looks transient (timeouts, UNAVAILABLE, permission denied, ...) is retried and then raised,
    leaving the checkpoint where it is, so re-running once the storage is back resumes from it;
  * the data-iterator state is a position in the global row stream, valid under any process count (1 -> 2 -> 4
    processes continue with the rows an uninterrupted run would have used), restored in O(1); one that cannot be
    used (missing, unreadable, an older per-process layout) only costs the exact data order: params and optimizer
    state are restored and the iterator is moved in O(1) to a position derived from the step (see engine/data_position.py),
    with a warning.

Owns writing the layout above and resuming from it (params, optimizer state, data position). Reading parameters
and a run's config without the trainer (converters, fine-tuning, init) is the weights layer's (weights/runs.py,
weights/source.py). Imports weights, errors, paths and the engine's state; never convert/.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from neobert_jax import bucket, errors, paths
from neobert_jax.engine import data_position
from neobert_jax.engine.state import TrainState
from neobert_jax.weights import runs
from neobert_jax.weights.flat import check_keys_and_shapes, path_key

log = logging.getLogger(__name__)


def make_manager(
  workdir: str | os.PathLike, keep: int = 3, async_save: bool = True, on_saved: Callable[[], None] | None = None
) -> ocp.CheckpointManager:
  """The run's manager. `on_saved()` runs (in Orbax's thread) when a background save has committed.

  The bucket's budget (neobert_jax/bucket.py) bounds every wait: the step directories are created in the calling
  thread, so a bucket that stays down fails the save there, as one line (`save_failed`), instead of in a
  background thread that prints a traceback while the trainer waits for its signal; and the background commit
  may take the retry window twice over (its arrays, then its metadata) before Orbax gives up on it."""
  directory = paths.resolve(workdir, '--workdir') / runs.CHECKPOINT_SUBDIR
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


def _data_args(data_iter: Any, save: bool) -> dict[str, Any]:
  if data_iter is None or not hasattr(data_iter, 'get_state'):
    return {}
  import grain  # imported here so that readers of params-only (converters) need not load grain

  return {'data': grain.checkpoint.CheckpointSave(data_iter) if save else grain.checkpoint.CheckpointRestore(data_iter)}


def save(
  mngr: ocp.CheckpointManager,
  step: int,
  state: TrainState,
  data_iter: Any,
  cfg: ml_collections.ConfigDict,
  *,
  with_optimizer: bool = True,
  last_good: int | None = None,
) -> None:
  """Starts saving `state` as `step` (arrays are written in the background when async); returns at once.

  The Grain iterator's position is captured synchronously here, so it matches exactly the batches the saved
  parameters have seen even while the arrays are still being written. Without the optimizer (fine-tuning's best
  evaluation) a step holds params and config only: what weights/runs.py reads, and not a resumable state.
  """
  args = {
    'params': ocp.args.StandardSave(nnx.to_pure_dict(state['params'])),
    **({'opt': ocp.args.StandardSave(state['opt'])} if with_optimizer else {}),
    **(
      {runs.EMA_ITEM: ocp.args.StandardSave(nnx.to_pure_dict(state['ema']))}
      if with_optimizer and 'ema' in state
      else {}
    ),
    runs.CONFIG_ITEM: ocp.args.JsonSave(cfg.to_dict()),
    **_data_args(data_iter, save=True),
  }
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
  """Closes the manager; after a failed save Orbax raises the same failure again here, which must not replace the
  error already on its way to the user."""
  try:
    mngr.close()
  except Exception as e:  # noqa: BLE001
    log.debug('closing the checkpoint manager after a failure: %s', errors.first_line(e))


# What a write failure says, in the words users search for; Orbax and tensorstore wrap them in long specs.
_WRITE_REASONS = (
  'No space left on device',
  'Read-only file system',
  'Permission denied',
  'Disk quota exceeded',
  'PERMISSION_DENIED',
  'RESOURCE_EXHAUSTED',
  'UNAVAILABLE',
  'DEADLINE_EXCEEDED',
)


def save_failed(mngr: ocp.CheckpointManager, e: BaseException, last_good: int | None = None) -> errors.StorageError:
  """The one line for a failed save, naming the last complete checkpoint: `last_good` when the caller knows it
  (the run saw it commit: no request to a storage that just failed), else the newest step listed there."""
  text = f'{type(e).__name__}: {e}'
  reason = next((r for r in _WRITE_REASONS if r in text), None) or errors.first_line(e).split(' [tensorstore_spec')[0]
  if not paths.local(paths.Path(mngr.directory)):
    bucket.gave_up()  # the run stops now: what it still sends to the bucket is tried once, not for a window
  good = last_good
  if good is None:
    try:
      good = runs.latest_step(paths.Path(mngr.directory))
    except Exception:  # noqa: BLE001 - the storage is down: say what is known
      good = None
  kept = (
    f'the last complete checkpoint, {mngr.directory}/{good}, is kept'
    if good is not None
    else 'no checkpoint of this run was complete yet'
  )
  return errors.StorageError(
    f'writing a checkpoint under {mngr.directory} failed ({reason}); {kept}. Free space '
    'or fix the storage, then re-run the same command to resume from it.'
  )


def _set_aside(mngr: ocp.CheckpointManager, step: int, reason: str) -> None:
  set_aside(paths.Path(mngr.directory), step, reason)
  mngr.reload()


def set_aside(directory: paths.Path, step: int, reason: str) -> None:
  """Renames step `step` of the checkpoints `directory`, whose bytes cannot be read (its arrays, or its copy of the
  config: train/resume.py), so it is neither retried nor overwritten by a later save of the same number; said
  loudly, with both paths, because it is the one thing resume ever moves."""
  src = directory / str(step)
  if jax.process_index() == 0 and src.exists():
    dst = src.with_name(f'{step}.corrupt')
    n = 1
    while dst.exists():
      dst, n = src.with_name(f'{step}.corrupt{n}'), n + 1
    src.rename(dst)
    log.error(
      'CHECKPOINT SET ASIDE: step %d at %s could not be read (%s). It was renamed to %s (nothing was '
      'deleted); inspect it, or delete it once you no longer need it.',
      step,
      src,
      reason,
      dst,
    )


# Status words of tensorstore / gRPC / cloud storage errors that describe the storage, not the bytes stored.
_TRANSIENT_WORDS = (
  'UNAVAILABLE',
  'DEADLINE_EXCEEDED',
  'RESOURCE_EXHAUSTED',
  'ABORTED',
  'CANCELLED',
  'PERMISSION_DENIED',
  'UNAUTHENTICATED',
  'Connection reset',
  'Too many open files',
  'timed out',
  'Timeout',
)
_READ_ATTEMPTS = 3
_RETRY_DELAY_S = 2.0


def _is_transient(e: BaseException) -> bool:
  """True for errors of the storage (retry, never discard); False for missing or malformed checkpoint data."""
  if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
    return False
  if isinstance(e, (OSError, TimeoutError, ConnectionError, MemoryError)):  # PermissionError is an OSError
    return True
  text = f'{type(e).__name__}: {e}'
  return any(w in text for w in _TRANSIENT_WORDS)


def _with_retries(read: Callable[[], Any], step: int, directory: Any) -> Any:
  """read(); transient storage errors are retried, then raised as errors.CheckpointError (checkpoint left alone)."""
  for attempt in range(1, _READ_ATTEMPTS + 1):
    try:
      return read()
    except Exception as e:  # noqa: BLE001
      if not _is_transient(e):
        raise
      if attempt == _READ_ATTEMPTS:
        raise errors.CheckpointError(
          f'checkpoint step {step} in {directory} could not be read after {attempt} attempts because of a '
          f'storage error ({errors.first_line(e)}). It was left in place; re-run once the storage is reachable to '
          f'resume from it.'
        ) from e
      log.warning(
        'reading checkpoint step %d failed (%s); retrying in %.0f s',
        step,
        errors.first_line(e),
        _RETRY_DELAY_S * attempt,
      )
      time.sleep(_RETRY_DELAY_S * attempt)
  raise AssertionError('unreachable')


def _items(abstract: TrainState) -> tuple[str, ...]:
  """The items of a step that hold `abstract`'s arrays."""
  return ('params', 'opt') + ((runs.EMA_ITEM,) if 'ema' in abstract else ())


def _pure(abstract: TrainState, item: str) -> Any:
  return abstract['opt'] if item == 'opt' else nnx.to_pure_dict(abstract[item])


def _restore_arrays(mngr: ocp.CheckpointManager, step: int, abstract: TrainState) -> dict[str, Any]:
  """params + opt (+ ema) of `step` onto `abstract`'s shardings; transient storage errors are retried, then raised."""
  args = ocp.args.Composite(**{item: ocp.args.StandardRestore(_pure(abstract, item)) for item in _items(abstract)})
  return _with_retries(lambda: mngr.restore(step, args=args), step, mngr.directory)


def _leaves(tree: Any) -> dict[str, Any]:
  # Orbax's metadata tree spells every node as a dict key ('1', 'value'); the abstract state uses sequence
  # indices and attributes. Their names agree.
  return {path_key(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _check_fits(
  mngr: ocp.CheckpointManager,
  step: int,
  abstract: TrainState,
  items: tuple[str, ...] = ('params', 'opt'),
  fix: str = '',
) -> None:
  """errors.ConfigError when the saved tree structure or shapes differ from `abstract`'s. Reads only the small
  metadata files, on this process alone (a handler, not a Checkpointer: no cross-process barrier)."""
  _check_fits_at(paths.Path(mngr.directory), step, abstract, items, fix)


def _check_fits_at(directory: paths.Path, step: int, abstract: TrainState, items: tuple[str, ...], fix: str) -> None:
  root = directory / str(step)
  for item in items:
    handler = ocp.StandardCheckpointHandler()
    absl_log = logging.getLogger('absl')
    level = absl_log.level
    absl_log.setLevel(logging.ERROR)  # "no step metadata in the item": expected in the manager's layout
    try:
      saved = _with_retries(lambda: handler.metadata(root / item), step, directory)
    finally:
      absl_log.setLevel(level)
    target = _pure(abstract, item)
    tree = getattr(saved, 'tree', saved)
    check_keys_and_shapes(
      _leaves(tree),
      {k: v.shape for k, v in _leaves(target).items()},
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


def restore_latest(mngr: ocp.CheckpointManager, abstract: TrainState, data_iter: Any) -> tuple[int, TrainState] | None:
  """Restores the newest readable step onto the shardings in `abstract` (any mesh); None if there is none.

  `data_iter` (if any) is moved in place to the saved position (see engine/data_position.py for a checkpoint written by
  another number of processes). Steps whose params/optimizer state are unreadable are reported and set aside;
  storage errors raise errors.CheckpointError and leave the checkpoint alone.
  """
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      _check_fits(mngr, step, abstract)
      restored = _restore_arrays(mngr, step, abstract)
    except (errors.CheckpointError, errors.ConfigError):
      raise
    except Exception as e:  # noqa: BLE001 - the bytes are damaged or missing: try the previous checkpoint
      older = [s for s in mngr.all_steps() if s < step]
      log.error(
        'checkpoint step %d in %s could not be restored (%s); %s',
        step,
        mngr.directory,
        errors.first_line(e),
        f'falling back to step {max(older)}' if older else 'no older checkpoint is left',
      )
      _set_aside(mngr, step, errors.first_line(e))
      continue
    _agree_on_step(step, mngr.directory)
    data_position.restore(mngr.directory, step, data_iter)
    state = {'opt': restored['opt']}
    for item in set(_items(abstract)) - {'opt'}:
      state[item] = jax.tree.map(lambda a: a, abstract[item])
      nnx.replace_by_pure_dict(state[item], restored[item])
    return step, state
  _agree_on_step(None, mngr.directory)
  return None


def restore_stage(
  directory: paths.Path, step: int, abstract: TrainState, data_iter: Any, *, optimizer: bool, data: bool
) -> Any:
  """What a new stage carries over from step `step` of another run's checkpoints in `directory` (init.*): with
  `optimizer`, its optimizer state restored onto `abstract['opt']`'s shardings (returned; None without); with
  `data`, `data_iter` moved to its data position (exactly, or with the warning of data_position.restore)."""
  opt = None
  if optimizer and not (directory / str(step) / 'opt').is_dir():
    raise errors.ConfigError(
      f'init.keep_optimizer=True: step {step} in {directory} holds no optimizer state (a fine-tuning run keeps '
      'none); set init.keep_optimizer=False to start the optimizer afresh'
    )
  if optimizer:
    _check_fits_at(
      directory,
      step,
      abstract,
      ('opt',),
      'its optimizer state does not fit the one this config builds (clipping switched on or off?); set '
      'init.keep_optimizer=False to start the optimizer afresh',
    )
    opt = _with_retries(lambda: runs.restore_opt_tree(directory, step, abstract['opt']), step, directory)
  if data:
    data_position.restore(directory, step, data_iter)
  return opt
