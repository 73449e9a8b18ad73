"""Where a run's data iterator stands in a checkpoint, and moving a fresh iterator there (resume, a new stage).

A step directory holds the Grain iterator state of every process (data/process_<i>-of-<n>.json). The train
iterator's state is a position in the global row stream (virtual shards; data/pipeline/iterators.py), valid under
any process count. engine/checkpoint.py restores a run's own position on resume; a new stage with
init.continue_data restores another run's (checkpoint.restore_stage).
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import jax

from neobert_jax import errors, paths

log = logging.getLogger('neobert_jax.engine.checkpoint')


_DATA_FILE = re.compile(r'process_(\d+)-of-(\d+)\.json')


def _data_writer_count(data_dir: paths.Path) -> int | None:
  """How many processes wrote the Grain states in `data_dir` (None if there are none)."""
  counts = {
    int(m.group(2)) for f in (data_dir.iterdir() if data_dir.is_dir() else ()) if (m := _DATA_FILE.fullmatch(f.name))
  }
  return max(counts) if counts else None


def _set_iterator_state(data_iter: Any, text: str) -> None:
  """What Grain's Orbax handler does on restore (same file format as its save): JSON for a DatasetIterator,
  raw bytes for any other iterator with get_state/set_state. Done here, not through mngr.restore, so that this
  per-process step can never enter a cross-process barrier that another process skips."""
  import grain  # pylint: disable=g-import-not-at-top

  data_iter.set_state(json.loads(text) if isinstance(data_iter, grain.DatasetIterator) else text.encode())


def _saved_data_state(data_dir: paths.Path, pid: int, nproc: int) -> tuple[str | None, str]:
  """(state text to restore on process `pid` of `nproc`, or None; what was found, for the log).

  The train iterator's state holds the positions of the process's own virtual shards (see
  neobert_jax/data/pipeline/iterators.py). Under the same process count each process reads its own file; under
  another, the files of every writer are merged into one table of all virtual shards, from which each process of
  this job takes its own (the pipeline refuses a count that does not divide data.virtual_shards). A state of an
  older layout is only usable under the same process count.
  """
  writers = _data_writer_count(data_dir)
  if writers is None:
    return None, 'the checkpoint holds no data-iterator state'
  own = data_dir / f'process_{pid}-of-{nproc}.json'
  names = (
    [own.name] if writers == nproc and own.is_file() else [f'process_{i}-of-{writers}.json' for i in range(writers)]
  )
  texts = []
  for name in names:
    try:
      texts.append((data_dir / name).read_text())
    except OSError as e:
      return None, f'the data-iterator state {name} could not be read ({errors.first_line(e)})'
  if len(texts) == 1:
    return texts[0], f'written by {writers} process(es), restored on {nproc}'
  if not all(_STREAM_MARK in t for t in texts):
    return None, (
      f'the checkpoint was written by {writers} process(es) with a per-process data layout and this job has {nproc}'
    )
  from neobert_jax.data.pipeline import iterators as pipeline  # pylint: disable=g-import-not-at-top

  merged = pipeline.merge_states([json.loads(t) for t in texts])
  return json.dumps(merged), f'written by {writers} process(es), merged and restored on {nproc}'


_STREAM_MARK = 'virtual-shards/'


def restore(
  directory: paths.Path,
  step: int,
  data_iter: Any,
  *,
  process_index: int | None = None,
  process_count: int | None = None,
) -> bool:
  """Moves `data_iter` (freshly made, at its start) to where it must be after `step` steps; True if exact.

  Exact (any process count): the saved global-stream position is set directly, which rebuilds one block, so
  resuming at step 1,000,000 costs what resuming at step 10 does. Otherwise (no state, an unreadable one, a
  per-process state from an older layout under another process count) the iterator is moved, also in O(1), to
  the start of global block `step` (past the data the run has seen when blocks hold at least one global batch):
  deterministic, but not the uninterrupted run's order. That is a warning, never a reason to discard a
  checkpoint whose parameters are fine.
  """
  if data_iter is None or not hasattr(data_iter, 'get_state'):
    return True
  pid = jax.process_index() if process_index is None else process_index
  nproc = jax.process_count() if process_count is None else process_count
  t0 = time.perf_counter()
  text, what = _saved_data_state(paths.Path(directory) / str(step) / 'data', pid, nproc)
  initial = data_iter.get_state()
  if text is not None:
    try:
      _set_iterator_state(data_iter, text)
      if hasattr(data_iter, 'start_prefetch'):
        data_iter.start_prefetch()
      log.info('checkpoint step %d: data position %s (%.2f s)', step, what, time.perf_counter() - t0)
      return True
    except Exception as e:  # noqa: BLE001 - the data position is recoverable; the checkpoint is not at fault
      what = f'the data-iterator state could not be used ({errors.first_line(e)})'
      data_iter.set_state(initial)
  from neobert_jax.data.pipeline import iterators as pipeline  # pylint: disable=g-import-not-at-top

  moved = 'left at the start of the stream'
  if isinstance(initial, dict) and initial.get('stream') == pipeline.STREAM:
    try:
      data_iter.set_state(pipeline.state_at(step, shards_=[int(v) for v in initial['shards']]))
      moved = f'moved to the start of block {step} of every virtual shard'
    except Exception:  # noqa: BLE001 - an iterator of another shape (workers): stay at the start
      data_iter.set_state(initial)
  log.warning(
    'checkpoint step %d: params and optimizer state restored, but %s. The data iterator was %s: '
    "training continues deterministically, but the data order is NOT the same as an uninterrupted run's.",
    step,
    what,
    moved,
  )
  return False
