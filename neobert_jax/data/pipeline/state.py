"""The train pipeline's position as data: the iterator state of one process, and the algebra across processes.

A source's state (host_batches.py) is {'stream': virtual.STREAM, 'shards': {virtual shard: [next block, next row]}},
the positions of the virtual shards the process owns; a pipeline that wraps sources (prefetch workers, a mixture of
sources) nests their states inside its own. Every function here walks that nesting, so a position written by any
number of processes merges into one table of all virtual shards, from which each process of another job takes its
own, and a lost position can be replaced by one derived from the step.
"""

from typing import Any

from neobert_jax.data import mixture as mixture_lib
from neobert_jax.data.pipeline import virtual


def _is_stream(state: Any) -> bool:
  return isinstance(state, dict) and state.get('stream') == virtual.STREAM


def state_at(block: int, row: int = 0, shards_: range | list[int] = range(1)) -> dict[str, Any]:
  """The state of one source with every virtual shard in `shards_` at `row` of its block `block`. A seek costs
  building one block per shard, whatever the number."""
  return {'stream': virtual.STREAM, 'shards': {str(v): [int(block), int(row)] for v in shards_}}


def holds_streams(state: Any) -> bool:
  """Whether a (JSON-decoded) state holds virtual-shard positions anywhere: those merge across process counts."""
  if _is_stream(state):
    return True
  if isinstance(state, dict):
    return any(holds_streams(v) for v in state.values())
  return isinstance(state, list) and any(holds_streams(v) for v in state)


def merge_states(states: list[Any]) -> Any:
  """One state holding every virtual shard's position, from the states of all processes of a run (same layout:
  the first one's, with the 'shards' tables of all of them joined)."""
  first = states[0]
  if isinstance(first, dict):
    if first.get('stream') == mixture_lib.STREAM:  # a mixture's sampler: each process holds its own slots
      return mixture_lib.merge_mixture_states(states)
    if _is_stream(first):
      joined = {}
      for s in states:
        joined.update(s['shards'])
      return {**first, 'shards': joined}
    return {k: merge_states([s[k] for s in states]) if all(k in s for s in states) else v for k, v in first.items()}
  if isinstance(first, list) and all(isinstance(s, list) and len(s) == len(first) for s in states):
    return [merge_states([s[i] for s in states]) for i in range(len(first))]
  return first


def seek(state: Any, block: int) -> Any:
  """`state` with every source's virtual shards at the start of block `block` (what a position lost from a
  checkpoint is replaced by: deterministic, past the data `block` steps have seen when a block holds at least one
  global batch)."""
  if _is_stream(state):
    return state_at(block, shards_=[int(v) for v in state['shards']])
  if isinstance(state, dict) and state.get('stream') == mixture_lib.STREAM:
    return {**state, 'step': block}  # the weights of the step the run is at; the credits of the start
  if isinstance(state, dict):
    return {k: seek(v, block) for k, v in state.items()}
  if isinstance(state, list):
    return [seek(v, block) for v in state]
  return state
