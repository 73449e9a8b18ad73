"""The pipeline keeps its own place in a checkpoint: `Position` saves the train iterator's state into a step's
data item and moves a fresh iterator back there; the engine holds it opaque (engine/checkpoint.DataPosition).

A source's state (host_batches.py) is {'stream': virtual.STREAM, 'shards': {virtual shard: [next block, next row]}};
wrappers (prefetch workers, a mixture) nest it, and the state functions below walk that nesting (docs/pods.md, "The
rule for another process count").
"""

import json
import logging
import re
import time
from typing import Any

from neobert_jax import errors, paths
from neobert_jax.data import mixture as mixture_lib
from neobert_jax.data.pipeline import virtual

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
    """Moves the fresh iterator to the position saved in `item` (a step's data item) after `step` steps; True if
    exact. Without a usable saved state it seeks to block `step` of every virtual shard, with a warning: a lost
    data position is never a reason to discard a checkpoint whose parameters are fine."""
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
    if holds_streams(initial):
      try:
        self.iterator.set_state(seek(initial, step))
        moved = f'moved to the start of block {step} of every virtual shard'
      except Exception:  # noqa: BLE001 - an iterator of another shape (workers): stay at the start
        self.iterator.set_state(initial)
    log.warning(
      f'checkpoint step {step}: params and optimizer state restored, but {what}. The data iterator was {moved}: '
      "training continues deterministically, but the data order is NOT the same as an uninterrupted run's."
    )
    return False


def _saved_state(item: paths.Path, pid: int, nproc: int) -> tuple[Any, str]:
  """(the state to restore on process `pid` of `nproc`, or None; what was found, for the log)."""
  writers = max(
    (int(m.group(2)) for f in (item.iterdir() if item.is_dir() else ()) if (m := _STATE_FILE.fullmatch(f.name))),
    default=None,
  )
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
  if not all(holds_streams(s) for s in states):
    return None, (
      f'the checkpoint was written by {writers} process(es) with a per-process data layout and this job has {nproc}'
    )
  return merge_states(states), f'written by {writers} process(es), merged and restored on {nproc}'


def _is_stream(state: Any) -> bool:
  return isinstance(state, dict) and state.get('stream') == virtual.STREAM


# Per kind of stream, its table with an entry per virtual shard (a source's positions, a mixture sampler's slots):
# the states of a run's processes merge by joining those tables.
_PER_SHARD = {virtual.STREAM: 'shards', mixture_lib.STREAM: 'slots'}


def state_at(block: int, row: int = 0, shards_: range | list[int] = range(1)) -> dict[str, Any]:
  """The state of one source with every virtual shard in `shards_` at `row` of its block `block`."""
  return {'stream': virtual.STREAM, 'shards': {str(v): [int(block), int(row)] for v in shards_}}


def holds_streams(state: Any) -> bool:
  """Whether a (JSON-decoded) state holds virtual-shard positions anywhere: those merge across process counts."""
  if _is_stream(state):
    return True
  nested = state.values() if isinstance(state, dict) else state if isinstance(state, list) else ()
  return any(holds_streams(v) for v in nested)


def merge_states(states: list[Any]) -> Any:
  """One state from the states of all processes of a run: the first one's, with their per-shard tables joined."""
  first = states[0]
  if isinstance(first, dict):
    table = _PER_SHARD.get(first.get('stream'))
    if table:
      return {**first, table: {k: v for s in states for k, v in s[table].items()}}
    return {k: merge_states([s[k] for s in states]) if all(k in s for s in states) else v for k, v in first.items()}
  if isinstance(first, list) and all(isinstance(s, list) and len(s) == len(first) for s in states):
    return [merge_states([s[i] for s in states]) for i in range(len(first))]
  return first


def seek(state: Any, block: int) -> Any:
  """`state` with every source's virtual shards at the start of block `block`: what replaces a lost position."""
  if _is_stream(state):
    return state_at(block, shards_=[int(v) for v in state['shards']])
  if isinstance(state, dict) and state.get('stream') == mixture_lib.STREAM:
    return {**state, 'step': block}  # the weights of the step the run is at; the credits of the start
  if isinstance(state, dict):
    return {k: seek(v, block) for k, v in state.items()}
  if isinstance(state, list):
    return [seek(v, block) for v in state]
  return state
