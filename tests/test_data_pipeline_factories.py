"""The pipeline's factories (neobert_jax/data/pipeline/factories.py) on synthetic prepared data: the batch contract,
determinism and reshuffled epochs, the held-out batches, long records, prefetch workers that resume exactly, and bad
config values named."""

import numpy as np
import pytest
from tests.support import pipeline_data

from neobert_jax.data.pipeline import batch as batch_contract
from tests.support import synthetic_data
from neobert_jax.data import pipeline


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return pipeline_data.write_corpus(tmp_path_factory)


@pytest.mark.parametrize('packing,max_predictions', [('packed', 0), ('none', 24)])
def test_batch_contract(data_dir, packing, max_predictions):
  it = pipeline.make_train_iterator(
    pipeline_data.data_cfg(data_dir, packing=packing, max_predictions=max_predictions), 8, 128, seed=0
  )
  b = next(it)
  want = {'input_ids', 'positions', 'segment_ids', 'labels'}
  if max_predictions:
    want |= {'mlm_positions', 'mlm_labels', 'mlm_weights'}
    assert b['mlm_positions'].shape == (8, max_predictions)
    assert b['mlm_weights'].dtype == np.float32
  assert set(b) == want
  for k in ('input_ids', 'positions', 'segment_ids', 'labels'):
    assert b[k].shape == (8, 128) and b[k].dtype == np.int32
  # what the train step reads is exactly data/pipeline/batch.py's contract
  for k, (shape, dtype) in batch_contract.row_shapes(128, max_predictions).items():
    assert b[k].shape == (8,) + shape and b[k].dtype == dtype, k
  if packing == 'none':
    assert b['segment_ids'].max() == 1
    lengths = (b['segment_ids'] > 0).sum(-1)  # what the train step derives
    for r, n in enumerate(lengths):  # right padding
      assert np.all(b['segment_ids'][r, :n] == 1) and np.all(b['segment_ids'][r, n:] == 0)
  else:
    assert b['segment_ids'].max() > 1  # several documents per row


def test_deterministic_and_epochs_reshuffle(data_dir):
  cfg = pipeline_data.data_cfg(data_dir)
  a = pipeline_data.take(pipeline.make_train_iterator(cfg, 8, 128, seed=3), 30)
  b = pipeline_data.take(pipeline.make_train_iterator(cfg, 8, 128, seed=3), 30)
  c = pipeline_data.take(pipeline.make_train_iterator(cfg, 8, 128, seed=4), 2)
  assert pipeline_data.same(a, b)
  assert not pipeline_data.same(a[:2], c)
  # 600 docs of ~60 tokens fill ~36k tokens = ~35 rows of 1024... here 128-wide
  # rows: an epoch is ~280 rows = 35 batches; first blocks of epoch 0 and 1 differ.
  order0 = [d for x in a[:4] for d in synthetic_data.documents_in(x)]
  it = pipeline.make_train_iterator(cfg, 8, 128, seed=3)
  seen, batches = set(), 0
  while len(seen) < pipeline_data.N_DOCS:  # every document appears within about one epoch
    seen.update(synthetic_data.documents_in(next(it)))
    batches += 1
  assert batches < 80  # each virtual shard ends its epoch at its own pace: the slowest sets the bound
  order1 = [d for x in pipeline_data.take(it, 4) for d in synthetic_data.documents_in(x)]
  assert order0 != order1


def test_eval_iterator_one_pass_and_fixed(data_dir):
  cfg = pipeline_data.data_cfg(data_dir, packing='none')
  a = list(pipeline.make_eval_iterator(cfg, 16, 128))
  b = list(pipeline.make_eval_iterator(cfg, 16, 128))
  assert len(a) == 3 and pipeline_data.same(a, b)  # 40 docs -> 16 + 16 + 8 real rows
  last = a[-1]
  assert np.all(last['labels'][8:] == -100) and np.all(last['segment_ids'][8:].sum(1) > 0)
  real = a[:2] + [{k: v[:8] for k, v in last.items()}]
  assert sorted(d for x in real for d in synthetic_data.documents_in(x)) == list(range(40))
  n = list(pipeline.make_eval_iterator(cfg, 16, 128, process_index=1, process_count=2, num_batches=5))
  assert len(n) == 5
  with pytest.raises(ValueError, match='num_batches'):
    pipeline.make_eval_iterator(cfg, 16, 128, process_index=0, process_count=2)


def test_long_records_are_split_to_seq_len(tmp_path):
  docs = synthetic_data.synthetic_documents(30, max_len=300)
  synthetic_data.write_prepared(str(tmp_path), docs, max_length=300)
  # One block = one epoch; batches of one row, so the count below stops exactly there.
  cfg = pipeline_data.data_cfg(str(tmp_path), packing='packed', block_docs=30)
  it = pipeline.make_train_iterator(cfg, 1, 64, seed=0)
  total = sum(len(d) for d in docs)
  got = 0
  while got < total:  # one epoch, no token lost
    b = next(it)
    assert b['positions'].max() < 64
    got += int((b['segment_ids'] > 0).sum())
  assert got == total


def test_bad_config_values_are_named(data_dir):
  with pytest.raises(ValueError, match='data.packing'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(data_dir, packing='greedy'), 8, 128, seed=0)
  with pytest.raises(ValueError, match='data.mask_strategy'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(data_dir, mask_strategy='x'), 8, 128, seed=0)


def test_multiprocess_prefetch_resumes_exactly(data_dir):
  # Spawning workers costs seconds each, so one run + one resumed run.
  cfg = pipeline_data.data_cfg(data_dir, num_workers=2, max_predictions=32)
  it = pipeline.make_train_iterator(cfg, 4, 128, seed=0)
  try:
    first = [next(it) for _ in range(6)]
    state = it.get_state()
    tail = [next(it) for _ in range(4)]
  finally:
    it.close()
  resumed = pipeline.make_train_iterator(cfg, 4, 128, seed=0)
  try:
    resumed.set_state(state)
    assert pipeline_data.same([next(resumed) for _ in range(4)], tail)
  finally:
    resumed.close()
  # Workers build different blocks: the batches are not one worker's repeated.
  assert not np.array_equal(first[0]['input_ids'], first[1]['input_ids'])
