"""Online input pipeline: prepared shards -> this host's packed, masked batches, while training runs.

Reads prepared data only: the offline side (data/prepare/) writes it. One job per module:

  factories.py     the train iterator (the run's sources, prefetched) and the held-out batches
  prepared.py      the run's sources (a mixture file, or data.dir as a mixture of one), read once and opened:
                   checking they fit the run, listing a split, opening its store
  store.py         reading a host's shards in place, or from a bucket into a bounded cache
  cache.py         what that cache must hold, checked when it opens
  virtual.py       dealing the corpus to hosts as virtual shards; blocks.py: which documents form a block
  builder.py       a block -> packed (packing.py), masked (masking.py) rows
  host_batches.py  one source's rows: every step, B/V rows from each of this host's virtual shards, and their position
  train_batches.py the training batches: each step's rows drawn from the sources (data/mixture.py's sampler)
  state.py         positions as data: merging the processes' states, seeking to a block
  position.py      the position in a checkpoint: saved with a step, restored from one
  report_files.py  a split's files as local paths, for reports
  batch.py         the batch contract with the train step

Callers use the names below (`from neobert_jax.data import pipeline`).
"""

from neobert_jax.data.pipeline.cache import cache_need
from neobert_jax.data.pipeline.factories import make_eval_iterator, make_train_iterator, virtual_shards
from neobert_jax.data.pipeline.position import Position
from neobert_jax.data.pipeline.prepared import Sources, open_data, open_prepared, prepare_builtin, read_mixture
from neobert_jax.data.pipeline.report_files import iter_split_files, split_files
from neobert_jax.data.pipeline.state import merge_states, state_at

__all__ = [
  'Position',
  'Sources',
  'cache_need',
  'iter_split_files',
  'make_eval_iterator',
  'make_train_iterator',
  'merge_states',
  'open_data',
  'open_prepared',
  'prepare_builtin',
  'read_mixture',
  'split_files',
  'state_at',
  'virtual_shards',
]
