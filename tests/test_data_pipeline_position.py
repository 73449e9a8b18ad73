"""The pipeline keeps its own place in a checkpoint (neobert_jax/data/pipeline/position.py): a position saved into a
step restores exactly, in the process count that wrote it or in another (the processes' files merged), at the cost
of one block whatever the step; a step without one moves the iterator in O(1), with a warning."""

import json
import time

import orbax.checkpoint as ocp
from tests.support import pipeline_data
import pytest

from neobert_jax.data import pipeline

GLOBAL_BATCH = 8


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return pipeline_data.write_corpus(tmp_path_factory, eval_docs=0)


def _iters(data_dir, n):
  """The n per-process train iterators of an n-process job (data.virtual_shards: 8, automatic for 8 rows)."""
  cfg = pipeline_data.data_cfg(data_dir, block_docs=40, max_predictions=16)
  return [
    pipeline.make_train_iterator(cfg, GLOBAL_BATCH // n, 128, seed=0, process_index=p, process_count=n)
    for p in range(n)
  ]


def _save(directory, step, position):
  """A step holding only `position`, as the engine writes it; returns the step's data item."""
  mngr = ocp.CheckpointManager(str(directory))
  mngr.save(step, args=ocp.args.Composite(data=position.save_arg()))
  mngr.wait_until_finished()
  mngr.close()
  return directory / str(step) / 'data'


def test_a_saved_position_restores_exactly_in_the_same_process_count(data_dir, tmp_path):
  (writer,) = _iters(data_dir, 1)
  pipeline_data.global_batches([writer], 7)
  item = _save(tmp_path / 'ckpt', 7, pipeline.Position(writer))
  want = pipeline_data.global_batches([writer], 5)
  (fresh,) = _iters(data_dir, 1)
  assert pipeline.Position(fresh).restore(item, 7)
  assert pipeline_data.same(pipeline_data.global_batches([fresh], 5), want)


def test_a_position_written_by_one_process_restores_on_two_and_four_in_constant_time(data_dir, tmp_path):
  step = 1_000_000
  (writer,) = _iters(data_dir, 1)
  writer.set_state(pipeline.state_at(block=987_654, row=5, shards_=range(8)))  # a 1M-step run's place
  next(writer)
  item = _save(tmp_path / 'ckpt', step, pipeline.Position(writer))
  want = pipeline_data.global_batches([writer], 3)
  for n in (2, 4):
    its = _iters(data_dir, n)
    t0 = time.perf_counter()
    assert all(pipeline.Position(it, p, n).restore(item, step) for p, it in enumerate(its))
    assert time.perf_counter() - t0 < 10  # one block built per virtual shard; a replay would build 1M
    assert pipeline_data.same(pipeline_data.global_batches(its, 3), want), n


def test_a_step_without_a_position_moves_in_constant_time_with_a_warning(data_dir, tmp_path, caplog):
  (it,) = _iters(data_dir, 1)
  assert not pipeline.Position(it).restore(tmp_path / '2000000' / 'data', 2_000_000)
  assert next(iter(it.get_state()['sources'].values())) == pipeline.state_at(2_000_000, shards_=range(8))
  assert 'no data-iterator state' in caplog.text and 'block 2000000 of every virtual shard' in caplog.text


def test_a_position_saved_before_sources_had_names_restores_exactly(data_dir, tmp_path):
  """A checkpoint of a plain data.dir written before a run's data was a list of named sources holds each process's
  {'stream', 'shards'}: it restores into the one source, exactly, under any process count."""
  its = _iters(data_dir, 2)
  pipeline_data.global_batches(its, 7)
  item = tmp_path / '7' / 'data'
  item.mkdir(parents=True)
  for p, it in enumerate(its):
    (old,) = it.get_state()['sources'].values()  # the one source's position: the whole state, then
    assert set(old) == {'stream', 'shards'}
    (item / f'process_{p}-of-2.json').write_text(json.dumps(old))
  want = pipeline_data.global_batches(its, 4)
  for n in (1, 2):
    fresh = _iters(data_dir, n)
    assert all(pipeline.Position(it, p, n).restore(item, 7) for p, it in enumerate(fresh))
    assert pipeline_data.same(pipeline_data.global_batches(fresh, 4), want), n
