"""The pipeline keeps its own place in a checkpoint: `Position` saves the train iterator's state into a step's
data item and moves a fresh iterator back there (resume; a new stage with init.continue_data). The engine holds it
as an opaque data position (engine/checkpoint.DataPosition) and never reads what is inside.

The item holds one file per process, process_<i>-of-<n>.json (Grain's Orbax handler writes them, captured when the
save starts, so the position matches the batches the saved parameters have seen). Under the same process count
each process reads its own file; under another, the files of every writer are merged into one table of all
virtual shards (state.py), from which each process of this job takes its own (the pipeline refuses a count that
does not divide data.virtual_shards). Restoring is a seek: one block rebuilt per virtual shard, whatever the step.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from neobert_jax import errors, paths
from neobert_jax.data.pipeline import state as data_state

log = logging.getLogger('neobert_jax.data')

_STATE_FILE = re.compile(r'process_(\d+)-of-(\d+)\.json')


class Position:
  """Where the train iterator of process `process_index` of `process_count` stands, as a checkpoint keeps it."""

  def __init__(self, iterator: Any, process_index: int = 0, process_count: int = 1):
    self.iterator, self.process_index, self.process_count = iterator, process_index, process_count

  def save_arg(self) -> Any:
    """The Orbax argument that writes the iterator's state, as it is now, into a step's data item."""
    import grain  # pylint: disable=g-import-not-at-top

    return grain.checkpoint.CheckpointSave(self.iterator)

  def restore(self, item: paths.Path, step: int) -> bool:
    """Moves the iterator (freshly made, at its start) to the position saved in `item` (a step's data item) after
    `step` steps; True if exact.

    Without a usable saved state (none, an unreadable one, a per-process state of another layout under another
    process count) the iterator is moved, also in O(1), to the start of block `step` of every virtual shard
    (state.seek): deterministic, but not the uninterrupted run's order. That is a warning, never a reason to
    discard a checkpoint whose parameters are fine.
    """
    t0 = time.perf_counter()
    saved, what = _saved_state(paths.Path(item), self.process_index, self.process_count)
    initial = self.iterator.get_state()
    if saved is not None:
      try:
        self.iterator.set_state(saved)
        if hasattr(self.iterator, 'start_prefetch'):
          self.iterator.start_prefetch()
        log.info('checkpoint step %d: data position %s (%.2f s)', step, what, time.perf_counter() - t0)
        return True
      except errors.ConfigError:  # a mixture whose sources changed since the checkpoint: the user's to decide
        raise
      except Exception as e:  # noqa: BLE001 - the data position is recoverable; the checkpoint is not at fault
        what = f'the data-iterator state could not be used ({errors.one_line(e)})'
        self.iterator.set_state(initial)
    moved = 'left at the start of the stream'
    if data_state.holds_streams(initial):
      try:
        self.iterator.set_state(data_state.seek(initial, step))
        moved = f'moved to the start of block {step} of every virtual shard'
      except Exception:  # noqa: BLE001 - an iterator of another shape (workers): stay at the start
        self.iterator.set_state(initial)
    log.warning(
      'checkpoint step %d: params and optimizer state restored, but %s. The data iterator was %s: '
      "training continues deterministically, but the data order is NOT the same as an uninterrupted run's.",
      step,
      what,
      moved,
    )
    return False


def _writer_count(item: paths.Path) -> int | None:
  """How many processes wrote the states in `item` (None if there are none)."""
  counts = {int(m.group(2)) for f in (item.iterdir() if item.is_dir() else ()) if (m := _STATE_FILE.fullmatch(f.name))}
  return max(counts) if counts else None


def _saved_state(item: paths.Path, pid: int, nproc: int) -> tuple[Any, str]:
  """(the state to restore on process `pid` of `nproc`, or None; what was found, for the log)."""
  writers = _writer_count(item)
  if writers is None:
    return None, 'the checkpoint holds no data-iterator state'
  own = item / f'process_{pid}-of-{nproc}.json'
  names = (
    [own.name] if writers == nproc and own.is_file() else [f'process_{i}-of-{writers}.json' for i in range(writers)]
  )
  states = []
  for name in names:
    try:
      states.append(json.loads((item / name).read_text()))
    except (OSError, ValueError) as e:
      return None, f'the data-iterator state {name} could not be read ({errors.one_line(e)})'
  if len(states) == 1:
    return states[0], f'written by {writers} process(es), restored on {nproc}'
  if not all(data_state.holds_streams(s) for s in states):
    return None, (
      f'the checkpoint was written by {writers} process(es) with a per-process data layout and this job has {nproc}'
    )
  return data_state.merge_states(states), f'written by {writers} process(es), merged and restored on {nproc}'
