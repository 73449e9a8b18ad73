"""One host's training batches: each step's rows drawn from the run's sources (data/mixture.py; a plain data.dir
is a mixture of one, whose rows are its own, in order).

Every source is read by its own HostBatches (its virtual shards, store, packing and masking: a packed row holds one
source); each step the sampler says, per virtual shard (slot) this process owns, how many of the slot's B/V rows
each source gives and where they go. Source virtual shard v feeds only slot v, so a process reads only its share of
every source and the rows of a step do not depend on the process count. The state is {'mixture': the sampler's
credits, 'sources': {name: that source's position}}; a position saved before sources had names (one source's
{'stream', 'shards'}) restores into the one source (upgrade_state).
"""

from __future__ import annotations

import logging
from typing import Any, Collection

import grain
import numpy as np

from neobert_jax.data import mixture as mixture_lib
from neobert_jax.data.pipeline import host_batches
from neobert_jax.data.pipeline import virtual


log = logging.getLogger('neobert_jax.data')


class TrainBatches(grain.IterDataset):
  """`sources`: each source's HostBatches (one row stream per virtual shard this process owns); `records`: the
  records of each source's virtual shards (an epoch); `block_docs`: each source's documents per block; `fresh`:
  sources a restore leaves at their start (data.mixture_fresh)."""

  def __init__(
    self,
    sources: dict[str, host_batches.HostBatches],
    mix: mixture_lib.Mixture,
    seed: int,
    rows_per_slot: int,
    records: dict[str, int],
    block_docs: dict[str, int],
    fresh: Collection[str] = (),
  ):
    super().__init__(list(sources.values()))
    self.sources, self.mix, self.seed, self.rows = sources, mix, seed, rows_per_slot
    self.records, self.block_docs, self.fresh = records, block_docs, fresh

  def __iter__(self):
    return _TrainIterator(self)


class _TrainIterator(grain.DatasetIterator):
  """State: {'mixture': the sampler's state, 'sources': {name: that source's position}}."""

  def __init__(self, ds: TrainBatches):
    super().__init__()
    self._ds = ds
    self._its = {n: iter(hb) for n, hb in ds.sources.items()}
    self._slots = list(next(iter(ds.sources.values())).blocks)
    self._sampler = mixture_lib.Sampler(ds.mix, ds.seed, ds.rows, self._slots)
    self._epochs: dict[str, int] = {}

  def __next__(self) -> dict:
    order = self._sampler.next()
    names = self._ds.mix.names
    if len(names) == 1:  # every row the one source's, in order
      it = self._its[names[0]]
      parts = [p for v in self._slots for p in it.take(v, len(order[v]))]
      self._note_epochs()
      return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    parts, grouped, offset = [], [], 0
    for v in self._slots:
      where = order[v]
      for i, need in enumerate(np.bincount(where, minlength=len(names)).tolist()):
        if need:  # the slot's rows grouped by source, in source order
          parts += self._its[names[i]].take(v, need)
      grouped.append(offset + np.argsort(where, kind='stable'))  # the slot's rows in that grouped order
      offset += len(where)
    self._note_epochs()
    grouped = np.concatenate(grouped)
    # One copy per key (so a batch does not keep its blocks alive): the grouped rows scattered to their places.
    out = {}
    for k in parts[0]:
      rows = np.concatenate([p[k] for p in parts])
      out[k] = np.empty_like(rows)
      out[k][grouped] = rows
    return out

  def _note_epochs(self) -> None:
    """Logs a source's next epoch: the first of this process's virtual shards of it to pass its last document."""
    if self._ds.mix.plain:
      return
    for name, it in self._its.items():
      block = max(b for b, _ in it.get_state()['shards'].values())
      epoch = block * self._ds.block_docs[name] // max(self._ds.records[name], 1)
      if epoch > self._epochs.get(name, 0):
        log.info('mixture source %r starts epoch %d (its documents again, reshuffled)', name, epoch + 1)
      self._epochs[name] = epoch

  def get_state(self) -> dict[str, Any]:
    return {'mixture': self._sampler.get_state(), 'sources': {n: it.get_state() for n, it in self._its.items()}}

  def set_state(self, state: dict[str, Any]) -> None:
    state = upgrade_state(state, self._ds.mix)
    if 'mixture' in state:
      self._sampler.set_state(state['mixture'], self._ds.fresh)
    saved = state['sources']
    if self._ds.mix.plain:  # its one source, whatever it was named
      saved = {self._ds.mix.names[0]: next(iter(saved.values()))}
    for n, it in self._its.items():
      if n in saved and n not in self._ds.fresh:
        it.set_state(saved[n])


def upgrade_state(state: dict[str, Any], mix: mixture_lib.Mixture) -> dict[str, Any]:
  """`state` in the present format: a position saved before sources had names (one source's {'stream', 'shards'})
  becomes that of a plain data.dir's one source, its sampler at its start (of one source, every step's rows are
  the source's whatever the credits); ValueError, saying why, for a mixture of several sources."""
  if not (isinstance(state, dict) and state.get('stream') == virtual.STREAM):
    return state
  if len(mix.sources) != 1:
    raise ValueError(
      f'the saved position is of one source (saved before sources had names), and {mix.where} has '
      f'{len(mix.sources)}: it cannot say where each of them stands'
    )
  return {'sources': {mix.names[0]: state}}
