"""Online input pipeline: prepared shards -> this host's packed, masked batches, while training runs.

  factories.py     the train iterator and the held-out batches; a block -> packed (packing.py), masked (masking.py)
  prepared.py      the run's sources, opened and checked against the run; a split's shards and store; reports' reads
  store.py         reading a host's shards in place, or from a bucket into a bounded cache
  virtual.py       dealing the corpus to hosts as virtual shards, and which records form each block
  host_batches.py  every step, B/V rows from each of this host's virtual shards, drawn from the sources
  position.py      the position in a checkpoint: saved with a step, restored from one; merged across processes
  batch.py         the batch contract with the train step

Callers use the names imported below (`from neobert_jax.data import pipeline`).
"""

from neobert_jax.data.pipeline.factories import cache_need, make_eval_iterator, make_train_iterator
from neobert_jax.data.pipeline.position import Position, merge_states, state_at
from neobert_jax.data.pipeline.prepared import Sources, open_data, open_prepared, prepare_builtin, read_mixture
