"""Positions as data (neobert_jax/data/pipeline/position.py): the processes' states merge into one table of every
virtual shard, nested states (prefetch workers, several sources) merge and seek source by source, and a state
without virtual-shard positions is told apart. Pure dicts: the iterators that write them are
tests/test_data_pipeline_host_batches.py's and tests/test_data_elastic.py's."""

import pytest

from neobert_jax.data import mixture, pipeline
from neobert_jax.data.pipeline import host_batches
from neobert_jax.data.pipeline import position


def _process_states(block):
  """The states of a two-process job over 4 virtual shards: process 0 owns 0-1, process 1 owns 2-3."""
  return [pipeline.state_at(block, 1, [0, 1]), pipeline.state_at(block, 2, [2, 3])]


def test_the_processes_states_merge_into_one_table_of_every_virtual_shard():
  merged = pipeline.merge_states(_process_states(5))
  assert merged['shards'] == {'0': [5, 1], '1': [5, 1], '2': [5, 2], '3': [5, 2]}
  assert merged['stream'] == pipeline.state_at(0)['stream']


def test_nested_states_merge_and_seek_source_by_source():
  # A pipeline that wraps sources nests their states: each source's table merges on its own.
  web, books = _process_states(5), _process_states(9)
  states = [{'sources': {'web': w, 'books': b}, 'step': 3} for w, b in zip(web, books)]
  merged = pipeline.merge_states(states)
  assert merged['sources']['web']['shards']['3'] == [5, 2] and merged['sources']['books']['shards']['0'] == [9, 1]
  assert merged['step'] == 3
  sought = position.seek(merged, 100)
  assert sought['sources']['web'] == pipeline.state_at(100, shards_=range(4)) and sought['step'] == 3
  assert position.holds_streams(merged) and position.holds_streams([merged])


def test_a_state_without_virtual_shard_positions_is_told_apart():
  assert not position.holds_streams({'workers': [1, 2], 'bytes': 'abc'})
  assert position.seek({'x': 1}, 7) == {'x': 1}


def test_a_plain_dir_is_a_named_source_and_a_state_saved_before_names_is_its_own():
  old = pipeline.state_at(5, 1, [0, 1])  # a plain data.dir's position as checkpoints held it before sources had names
  one = mixture.Mixture.of_dir('gs://bucket/data/web v2/')
  assert one.names == ('web_v2',) and one.plain and one.block_docs(4096, '', {'web_v2': 10}) == {'web_v2': 4096}
  assert host_batches.upgrade_state(old, one) == {'sources': {'web_v2': old}}
  two = mixture.parse_mixture({'a': {'dir': '/a', 'weight': 1}, 'b': {'dir': '/b', 'weight': 1}}, 'mix.json')
  with pytest.raises(ValueError, match='saved before sources had names.* has 2'):
    host_batches.upgrade_state(old, two)
