"""Prepared-data format v2: ids stored as uint16 when the vocabulary has fewer than 65,536 ids (int32 otherwise),
the width named in the manifest; v1 directories (int32) still read.

`prepare` writes v2 with the width its tokenizer needs; a v2 shard holds the same documents as a v1 shard in about
half the bytes; v1 and v2 directories of the same documents give the same training and held-out batches, locally
and from a bucket (the GCS emulator); a missing, unknown or too narrow width in a manifest is one line. The Ray
engine's v2 output is compared with the local engine's in test_data_prepare_ray.py.
"""

import json
import os
import shutil
import uuid

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax import errors, paths
from neobert_jax.config import data as config_lib
from neobert_jax.data import shards
from tests.support import synthetic_data
from neobert_jax.data import pipeline
from neobert_jax.data.prepare import local as prepare_lib
from neobert_jax.data.prepare import publish

WORDS = ('the', 'cat', 'sat', 'on', 'mat', 'dog', 'ran', 'far', 'away', 'home')
BLOCK = 2**16  # an ArrayRecord file ends on a 64 KiB boundary: sizes compare to within one block
VOCAB = 60_000  # ids above 32,767: a uint16 read as a signed type would turn them negative


def _shard_bytes(manifest):
  return sum(s['bytes'] for split in manifest['splits'].values() for s in split['shards'])


def _raw_records(directory, manifest, split='train'):
  out = []
  for s in manifest['splits'][split]['shards']:
    r = ArrayRecordReader(os.path.join(directory, s['file']))
    out += r.read_all()
    r.close()
  return out


def _corpus(tmp_path, n=300):
  rng = np.random.default_rng(0)
  path = tmp_path / 'raw.jsonl'
  path.write_text(
    ''.join(json.dumps({'text': ' '.join(rng.choice(WORDS, rng.integers(1, 60)))}) + '\n' for _ in range(n))
  )
  return str(path)


def test_width_follows_the_vocabulary():
  assert shards.id_dtype_name(30522) == 'uint16'
  assert shards.id_dtype_name(65535) == 'uint16'
  assert shards.id_dtype_name(65536) == 'int32'
  assert shards.Manifest({'format': shards.FORMAT, 'id_dtype': 'uint16'}).id_dtype == np.dtype('<u2')
  assert shards.Manifest({'format': shards.FORMAT, 'id_dtype': 'int32'}).id_dtype == np.dtype('<i4')
  assert shards.Manifest({'format': shards.FORMAT_V1}).id_dtype == np.dtype('<i4')


def test_prepare_writes_v2_with_two_bytes_per_token(tmp_path):
  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), WORDS)
  out = str(tmp_path / 'out')
  m = prepare_lib.prepare_local([_corpus(tmp_path)], out, tokenizer=vocab, max_length=32, eval_fraction=0.1, workers=0)
  assert m['format'] == shards.FORMAT == 'neobert_jax.prepared/v2' and m['id_dtype'] == 'uint16'
  assert shards.Manifest.read(out).raw == m
  records = _raw_records(out, m)
  assert sum(len(r) for r in records) == 2 * m['splits']['train']['tokens']
  ids = [shards.decode(r, np.dtype('<u2')) for r in records]
  assert all(r.dtype == np.int32 and r[0] == 2 and r[-1] == 3 for r in ids)  # [CLS] ... [SEP], widened


def test_a_vocabulary_of_65536_ids_or_more_falls_back_to_int32(tmp_path):
  words = WORDS + tuple(f'w{i}' for i in range(66_000))
  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), words)
  raw = tmp_path / 'raw.txt'
  raw.write_text('the cat w65999 sat\nw65000 w12 home\nfar away\n')  # ids above 65,535 among them
  out = str(tmp_path / 'out')
  m = prepare_lib.prepare_local([str(raw)], out, tokenizer=vocab, max_length=32, eval_fraction=0.0, workers=0)
  assert m['tokenizer']['vocab_size'] > 2**16 and m['id_dtype'] == 'int32'
  records = _raw_records(out, shards.Manifest.read(out).raw)
  assert sum(len(r) for r in records) == 4 * m['splits']['train']['tokens']
  ids = np.concatenate([shards.decode(r, shards.Manifest(m).id_dtype) for r in records])
  assert ids.max() >= 2**16  # kept whole, not wrapped
  # The synthetic writer follows the same rule.
  big = synthetic_data.write_prepared(
    str(tmp_path / 'syn'), synthetic_data.synthetic_documents(5, vocab_size=70_000), vocab_size=70_000
  )
  assert big['id_dtype'] == 'int32'


def test_an_id_that_does_not_fit_is_refused(tmp_path):
  writer = shards.ShardWriter(str(tmp_path), 'train', 1 << 20, id_dtype='uint16')
  with pytest.raises(errors.DataError, match='token id 70000 does not fit uint16'):
    writer.write_document([np.array([2, 70_000, 3], np.int32)])


def test_v2_shards_are_half_the_bytes_of_v1(tmp_path):
  docs = synthetic_data.synthetic_documents(2000, seed=0, min_len=200, max_len=1000)
  v1 = synthetic_data.write_prepared(str(tmp_path / 'v1'), docs, version=1)
  v2 = synthetic_data.write_prepared(str(tmp_path / 'v2'), docs)
  assert v1['format'] == shards.FORMAT_V1 and 'id_dtype' not in v1 and v2['id_dtype'] == 'uint16'
  tokens = v2['splits']['train']['tokens']
  counts = lambda m: {k: v for k, v in m['splits']['train'].items() if k != 'shards'}
  assert counts(v1) == counts(v2) and tokens > 500_000
  saved = _shard_bytes(v1) - _shard_bytes(v2)
  assert abs(saved - 2 * tokens) <= BLOCK  # exactly two bytes per token, to within the file's padding
  assert 0.5 < _shard_bytes(v2) / _shard_bytes(v1) < 0.53


@pytest.fixture(scope='module')
def v1_and_v2(tmp_path_factory):
  """The same documents, in small shards, as a v1 and a v2 directory."""
  root = tmp_path_factory.mktemp('formats')
  docs = synthetic_data.synthetic_documents(400, seed=0, max_len=120, vocab_size=VOCAB)
  evals = synthetic_data.synthetic_documents(30, seed=1, max_len=120, vocab_size=VOCAB)
  out = {}
  for version in (1, 2):
    out[version] = str(root / f'v{version}')
    synthetic_data.write_prepared(
      out[version], docs, evals, vocab_size=VOCAB, shard_bytes=30_000, max_length=128, version=version
    )
  return out


def _batches(directory, train=12):
  cfg = config_lib.default_data_config()
  cfg.dir, cfg.block_docs, cfg.max_predictions = directory, 64, 24
  it = pipeline.make_train_iterator(cfg, 8, 128, seed=5, model_vocab_size=VOCAB)
  return [next(it) for _ in range(train)] + list(pipeline.make_eval_iterator(cfg, 8, 128, model_vocab_size=VOCAB))


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


def test_v1_and_v2_directories_give_the_same_batches(v1_and_v2):
  for version, directory in v1_and_v2.items():
    m = shards.Manifest.read(directory).raw
    assert m['format'] == {1: shards.FORMAT_V1, 2: shards.FORMAT}[version]
  v1, v2 = _batches(v1_and_v2[1]), _batches(v1_and_v2[2])
  assert v2[0]['input_ids'].dtype == np.int32 and v2[0]['input_ids'].max() > 2**15  # past int16's range, whole
  _assert_same(v1, v2)
  # Every document is read back whole: the held-out pass holds each held-out document once.
  assert sorted(d for b in v2[12:] for d in synthetic_data.documents_in(b)) == list(range(30))


def test_v1_and_v2_on_a_bucket_give_the_local_batches(v1_and_v2, gcs):
  want = _batches(v1_and_v2[2])
  for version, directory in v1_and_v2.items():
    url = f'{gcs}/{uuid.uuid4().hex[:8]}/v{version}'
    publish.upload(directory, paths.Path(url), shards.Manifest.read(directory))
    try:
      _assert_same(_batches(url), want)
    finally:  # this machine's copy of the bucket's data, if the pipeline keeps one
      shutil.rmtree(paths.cache_dir('staged', paths.url_key(url)), ignore_errors=True)


def _damaged(directory, tmp_path, name, change):
  out = tmp_path / name
  out.mkdir()
  for f in os.listdir(directory):
    os.symlink(os.path.join(directory, f), out / f)
  os.remove(out / shards.MANIFEST)
  m = shards.Manifest.read(directory).raw
  change(m)
  (out / shards.MANIFEST).write_text(json.dumps(m))
  return str(out)


@pytest.mark.parametrize(
  'name,change,message',
  [
    ('missing', lambda m: m.pop('id_dtype'), "id_dtype None: not one of ['int32', 'uint16']"),
    ('unknown', lambda m: m.update(id_dtype='int16'), "id_dtype 'int16': not one of"),
    ('not-a-name', lambda m: m.update(id_dtype=2), 'id_dtype 2: not one of'),
    (
      'too-narrow',
      lambda m: m['tokenizer'].update(vocab_size=65536),
      "id_dtype 'uint16' cannot hold the ids of a 65536-id vocabulary",
    ),
    ('format', lambda m: m.update(format='neobert_jax.prepared/v3'), "format 'neobert_jax.prepared/v3', expected"),
  ],
)
def test_a_damaged_or_unknown_width_is_one_line(v1_and_v2, tmp_path, name, change, message):
  directory = _damaged(v1_and_v2[2], tmp_path, name, change)
  with pytest.raises(errors.DataError) as e:
    shards.Manifest.read(directory)
  text = str(e.value)
  assert message in text and '\n' not in text, text
  assert text.startswith(f'{directory}/manifest.json: ') and 'prepare it again' in text
  cfg = config_lib.default_data_config()
  cfg.dir = directory
  with pytest.raises(errors.DataError, match='manifest'):  # the training pipeline refuses it before any batch
    pipeline.make_train_iterator(cfg, 8, 128, seed=0)


def test_a_v1_manifest_needs_no_width(v1_and_v2, tmp_path):
  # v1 never had the field: whatever a v1 manifest says, its ids are int32.
  directory = _damaged(v1_and_v2[1], tmp_path, 'v1-stray', lambda m: m.update(id_dtype='uint16'))
  assert shards.Manifest.read(directory).id_dtype == np.dtype('<i4')
