"""`prepare` reads Hugging Face datasets (data/prepare/hf.py): a folder written by save_to_disk (a Dataset, a
DatasetDict's train split or one named split) and, through load_dataset's streaming reader, a dataset folder (the
reader a hub id streams through; offline here, as no test may touch the network). Each gives the shards the same
text gives as JSONL; a wrong column, an unknown split and the Ray engine are one line each."""

import json

import datasets
import numpy as np
import pytest

from neobert_jax import errors
from neobert_jax.data import shards
from tests.support import synthetic_data
from neobert_jax.data.prepare import hf
from neobert_jax.data.prepare import local as prepare_lib
from neobert_jax.data.prepare import ray_engine

WORDS = ('the', 'cat', 'sat', 'on', 'mat', 'dog', 'ran', 'far', 'away', 'home')


@pytest.fixture(autouse=True)
def offline(monkeypatch):
  """No test here may reach the hub: the datasets library is told it is offline."""
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', True, raising=False)


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
  return synthetic_data.write_wordpiece_vocab(str(tmp_path_factory.mktemp('vocab') / 'vocab.txt'), WORDS)


@pytest.fixture(scope='module')
def texts():
  rng = np.random.default_rng(0)
  return [' '.join(rng.choice(WORDS, rng.integers(1, 30))) for _ in range(300)]


def _prepare(inputs, out, vocab, **kw) -> dict:
  return prepare_lib.prepare_local(inputs, str(out), tokenizer=vocab, max_length=16, eval_fraction=0.1, **kw)


def _made(manifest: dict) -> dict:
  """What a prepare made (its splits: files, counts and checksums), not how it was called."""
  return manifest['splits']


@pytest.fixture(scope='module')
def from_jsonl(tmp_path_factory, texts, vocab):
  d = tmp_path_factory.mktemp('jsonl')
  (d / 'in.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in texts))
  return _prepare([str(d / 'in.jsonl')], d / 'out', vocab)


def test_a_saved_dataset_gives_the_shards_its_text_gives_as_jsonl(tmp_path, texts, vocab, from_jsonl):
  saved = tmp_path / 'saved'
  datasets.Dataset.from_dict({'text': texts, 'n': list(range(len(texts)))}).save_to_disk(str(saved))
  m = _prepare([str(saved)], tmp_path / 'out', vocab, workers=2)
  assert _made(m) == _made(from_jsonl)
  assert m['input_files'] == [str(saved)]
  assert shards.Manifest.read(str(tmp_path / 'out')).raw['splits'] == _made(m)


def test_a_saved_dataset_dict_reads_its_train_split_or_the_split_named(tmp_path, texts, vocab, from_jsonl):
  saved = tmp_path / 'dict'
  datasets.DatasetDict(
    {
      'train': datasets.Dataset.from_dict({'text': texts}),
      'validation': datasets.Dataset.from_dict({'text': texts[:50]}),
    }
  ).save_to_disk(str(saved))
  assert _made(_prepare([str(saved)], tmp_path / 'a', vocab)) == _made(from_jsonl)
  docs = [d.text for d in hf_documents(str(saved / 'validation'))]
  assert docs == texts[:50]


def hf_documents(item, **kw):
  from neobert_jax.data.prepare import sources  # pylint: disable=g-import-not-at-top

  return list(sources.iter_documents(item, **kw))


def test_streaming_reads_a_dataset_folder_in_order(tmp_path, texts, vocab, from_jsonl):
  folder = tmp_path / 'repo'
  folder.mkdir()
  (folder / 'part-0.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in texts[:150]))
  (folder / 'part-1.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in texts[150:]))
  item = f'hf:{folder}'
  docs = hf_documents(item)
  assert [d.text for d in docs] == texts and [d.offset for d in docs[:3]] == [0, 1, 2]
  assert _made(_prepare([item], tmp_path / 'out', vocab)) == _made(from_jsonl)


def test_hub_ids_name_a_config_and_a_split():
  assert hf.hub_spec('hf:allenai/c4') == ('allenai/c4', None, 'train')
  assert hf.hub_spec('hf:allenai/c4:en') == ('allenai/c4', 'en', 'train')
  assert hf.hub_spec('hf:wikitext:wikitext-2-raw-v1:validation') == ('wikitext', 'wikitext-2-raw-v1', 'validation')
  assert hf.hub_spec('hf:wikitext::test') == ('wikitext', None, 'test')
  with pytest.raises(errors.DataError, match='expected hf:ID'):
    hf.hub_spec('hf:')


def test_a_wrong_column_or_split_is_one_line(tmp_path, texts, vocab):
  saved = tmp_path / 'saved'
  datasets.Dataset.from_dict({'body': texts}).save_to_disk(str(saved))
  with pytest.raises(errors.DataError, match=r"no column 'text' \(columns: \['body'\]\); choose one with --text-field"):
    _prepare([str(saved)], tmp_path / 'out', vocab)
  assert _made(_prepare([str(saved)], tmp_path / 'ok', vocab, text_field='body'))['train']['documents'] > 0
  only_test = tmp_path / 'dict'
  datasets.DatasetDict({'test': datasets.Dataset.from_dict({'text': texts})}).save_to_disk(str(only_test))
  with pytest.raises(errors.DataError, match=r"without a 'train' split; pass .*/SPLIT, SPLIT one of \['test'\]"):
    _prepare([str(only_test)], tmp_path / 'out2', vocab)
  with pytest.raises(errors.DataError, match='cannot stream'):
    _prepare([f'hf:{tmp_path}/nothing-here'], tmp_path / 'out3', vocab)


def test_the_ray_engine_refuses_a_dataset_before_connecting(tmp_path, vocab):
  with pytest.raises(errors.ConfigError, match=r'--engine=ray reads files; prepare a Hugging Face dataset with'):
    ray_engine.prepare_on_ray(['hf:allenai/c4'], str(tmp_path / 'out'), tokenizer=vocab, ray_address='127.0.0.1:1')
  assert not (tmp_path / 'out').exists()
