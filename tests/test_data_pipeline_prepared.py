"""Opening prepared data (neobert_jax/data/pipeline/prepared.py): data made with another tokenizer or vocabulary,
and data that is missing, truncated or corrupt, are refused in one line before training."""

import os

import pytest
from tests.support import pipeline_data

from neobert_jax import errors
from neobert_jax.data import pipeline
from tests.support import synthetic_data


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return pipeline_data.write_corpus(tmp_path_factory)


def test_refuses_mismatched_tokenizer_and_vocab(data_dir, tmp_path):
  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'))
  with pytest.raises(errors.DataError, match='prepared with tokenizer'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(data_dir, tokenizer=vocab), 8, 128, seed=0)
  with pytest.raises(errors.DataError, match='vocab_size=1000'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(data_dir), 8, 128, seed=0, model_vocab_size=1000)


def test_refuses_missing_truncated_or_corrupt_data(data_dir, tmp_path):
  with pytest.raises(errors.DataError, match='does not exist'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(str(tmp_path / 'nope')), 8, 128, seed=0)
  (tmp_path / 'empty').mkdir()
  with pytest.raises(errors.DataError, match='no manifest.json'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(str(tmp_path / 'empty')), 8, 128, seed=0)
  d = tmp_path / 'copy'
  d.mkdir()
  for name in os.listdir(data_dir):
    (d / name).write_bytes(open(os.path.join(data_dir, name), 'rb').read())
  shard = d / 'train-00001.arrayrecord'
  raw = shard.read_bytes()
  shard.write_bytes(raw[: len(raw) // 2])  # truncated
  with pytest.raises(errors.DataError, match='truncated'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(str(d)), 8, 128, seed=0)
  shard.write_bytes(b'\0' * len(raw))  # right size, garbage inside
  with pytest.raises(errors.DataError, match='corrupt'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(str(d)), 8, 128, seed=0)
  shard.unlink()
  with pytest.raises(errors.DataError, match='missing'):
    pipeline.make_train_iterator(pipeline_data.data_cfg(str(d)), 8, 128, seed=0)
