"""The Grain training pipeline on synthetic prepared data: batch contract,
determinism, exact resume, per-process disjointness, and refusals."""

import json
import os

import numpy as np
import pytest

from neobert_jax.config import data as config_lib
from neobert_jax.data.pipeline import batch as batch_contract
from neobert_jax import errors
from support import synthetic_data
from neobert_jax.data.pipeline import iterators as pipeline

N_DOCS = 600


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp('prepared'))
  docs = synthetic_data.synthetic_documents(N_DOCS, seed=0, max_len=120)
  evals = synthetic_data.synthetic_documents(40, seed=1, max_len=120)
  # Small shards, so documents come from several files.
  synthetic_data.write_prepared(d, docs, evals, shard_bytes=40_000, max_length=128)
  return d


def _cfg(data_dir, **kw):
  cfg = config_lib.default_data_config()
  cfg.dir = data_dir
  cfg.block_docs = 64
  cfg.update(kw)
  return cfg


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(a, b):
  return all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.mark.parametrize('packing,max_predictions', [('packed', 0), ('none', 24)])
def test_batch_contract(data_dir, packing, max_predictions):
  it = pipeline.make_train_iterator(_cfg(data_dir, packing=packing, max_predictions=max_predictions), 8, 128, seed=0)
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
  cfg = _cfg(data_dir)
  a = _take(pipeline.make_train_iterator(cfg, 8, 128, seed=3), 30)
  b = _take(pipeline.make_train_iterator(cfg, 8, 128, seed=3), 30)
  c = _take(pipeline.make_train_iterator(cfg, 8, 128, seed=4), 2)
  assert _same(a, b)
  assert not _same(a[:2], c)
  # 600 docs of ~60 tokens fill ~36k tokens = ~35 rows of 1024... here 128-wide
  # rows: an epoch is ~280 rows = 35 batches; first blocks of epoch 0 and 1 differ.
  order0 = [d for x in a[:4] for d in synthetic_data.documents_in(x)]
  it = pipeline.make_train_iterator(cfg, 8, 128, seed=3)
  seen, batches = set(), 0
  while len(seen) < N_DOCS:  # every document appears within about one epoch
    seen.update(synthetic_data.documents_in(next(it)))
    batches += 1
  assert batches < 80  # each virtual shard ends its epoch at its own pace: the slowest sets the bound
  order1 = [d for x in _take(it, 4) for d in synthetic_data.documents_in(x)]
  assert order0 != order1


@pytest.mark.parametrize('packing', ['packed', 'none'])
def test_exact_resume_mid_block_and_across_epochs(data_dir, packing):
  cfg = _cfg(data_dir, packing=packing, max_predictions=16)
  ref = pipeline.make_train_iterator(cfg, 8, 128, seed=0)
  states, batches = [], []
  for _ in range(90):  # > 2 epochs with the 'packed' rows
    states.append(ref.get_state())
    batches.append(next(ref))
  for i in (0, 5, 37, 61):
    it = pipeline.make_train_iterator(cfg, 8, 128, seed=0)
    it.set_state(json.loads(json.dumps(states[i])))  # must survive a JSON round trip
    assert _same(_take(it, 3), batches[i : i + 3]), i


def test_processes_split_one_global_stream(data_dir):
  # Process p of 3 owns rows [10p, 10p + 10) of every global batch of 30: disjoint, and together exactly the
  # single-process stream (tests/test_data_elastic.py: the same holds across a change of process count).
  cfg = _cfg(data_dir, packing='none')
  whole = pipeline.make_train_iterator(cfg, 30, 128, seed=0)
  parts = [pipeline.make_train_iterator(cfg, 10, 128, seed=0, process_index=p, process_count=3) for p in range(3)]
  seen = []
  for _ in range(80):  # two epochs of 600 docs (blocks straddle the epoch end)
    batch, mine = next(whole), [next(it) for it in parts]
    for k in batch:
      assert np.array_equal(batch[k], np.concatenate([m[k] for m in mine]))
    seen.append([set(synthetic_data.documents_in(m)) for m in mine])
  assert set.union(*[d for docs in seen for d in docs]) == set(range(N_DOCS))


def test_eval_iterator_one_pass_and_fixed(data_dir):
  cfg = _cfg(data_dir, packing='none')
  a = list(pipeline.make_eval_iterator(cfg, 16, 128))
  b = list(pipeline.make_eval_iterator(cfg, 16, 128))
  assert len(a) == 3 and _same(a, b)  # 40 docs -> 16 + 16 + 8 real rows
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
  cfg = _cfg(str(tmp_path), packing='packed', block_docs=30)
  it = pipeline.make_train_iterator(cfg, 1, 64, seed=0)
  total = sum(len(d) for d in docs)
  got = 0
  while got < total:  # one epoch, no token lost
    b = next(it)
    assert b['positions'].max() < 64
    got += int((b['segment_ids'] > 0).sum())
  assert got == total


def test_refuses_mismatched_tokenizer_and_vocab(data_dir, tmp_path):
  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'))
  with pytest.raises(errors.DataError, match='prepared with tokenizer'):
    pipeline.make_train_iterator(_cfg(data_dir, tokenizer=vocab), 8, 128, seed=0)
  with pytest.raises(errors.DataError, match='vocab_size=1000'):
    pipeline.make_train_iterator(_cfg(data_dir), 8, 128, seed=0, model_vocab_size=1000)


def test_refuses_missing_truncated_or_corrupt_data(data_dir, tmp_path):
  with pytest.raises(errors.DataError, match='does not exist'):
    pipeline.make_train_iterator(_cfg(str(tmp_path / 'nope')), 8, 128, seed=0)
  (tmp_path / 'empty').mkdir()
  with pytest.raises(errors.DataError, match='no manifest.json'):
    pipeline.make_train_iterator(_cfg(str(tmp_path / 'empty')), 8, 128, seed=0)
  d = tmp_path / 'copy'
  d.mkdir()
  for name in os.listdir(data_dir):
    (d / name).write_bytes(open(os.path.join(data_dir, name), 'rb').read())
  shard = d / 'train-00001.arrayrecord'
  raw = shard.read_bytes()
  shard.write_bytes(raw[: len(raw) // 2])  # truncated
  with pytest.raises(errors.DataError, match='truncated'):
    pipeline.make_train_iterator(_cfg(str(d)), 8, 128, seed=0)
  shard.write_bytes(b'\0' * len(raw))  # right size, garbage inside
  with pytest.raises(errors.DataError, match='corrupt'):
    pipeline.make_train_iterator(_cfg(str(d)), 8, 128, seed=0)
  shard.unlink()
  with pytest.raises(errors.DataError, match='missing'):
    pipeline.make_train_iterator(_cfg(str(d)), 8, 128, seed=0)


def test_bad_config_values_are_named(data_dir):
  with pytest.raises(ValueError, match='data.packing'):
    pipeline.make_train_iterator(_cfg(data_dir, packing='greedy'), 8, 128, seed=0)
  with pytest.raises(ValueError, match='data.mask_strategy'):
    pipeline.make_train_iterator(_cfg(data_dir, mask_strategy='x'), 8, 128, seed=0)
