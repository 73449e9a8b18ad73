"""Data on a bucket: a real GCS server on 127.0.0.1 (gcp-storage-emulator, started by tests/conftest.py).

`prepare` from raw files on gs:// into shards on gs:// gives the bytes a local prepare gives; --overwrite on a
bucket removes the old shards only after the new manifest is up; a missing bucket is one line before tokenizing.
Training with data.dir on gs:// (each host fetches its own shards into a bounded cache, data/pipeline/store.py)
gives exactly the weights of the same run on the local directory; a damaged shard on the bucket is one line naming
its URL; two hosts with caches of their own each download about half and together give the single host's rows; a
corpus larger than the cache budget trains, evicting and fetching again, within the budget."""

import gzip
import json
import os
import shutil
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from neobert_jax import errors, paths
from neobert_jax.config import data as data_config
from neobert_jax.data import shards
from tests.support import synthetic_data
from neobert_jax.data import pipeline
from neobert_jax.data.pipeline import virtual
from neobert_jax.data.prepare import publish
from neobert_jax.data.prepare import local as prepare_lib
from neobert_jax.weights import runs
from neobert_jax.jobs import pretrain as pretrain_job
from tests.support.tiny_train import tiny_config, train_only

pytestmark = pytest.mark.server

WORDS = ('the', 'cat', 'sat', 'on', 'mat', 'dog', 'ran', 'far', 'away', 'home')
# Fields that record where and when a prepare ran, not what it made.
RUN_FIELDS = ('input_files', 'command', 'seconds')


@pytest.fixture
def root(gcs):
  """A fresh prefix on the bucket; the staged copies made of it are removed from this machine's cache after."""
  url = f'{gcs}/{uuid.uuid4().hex[:8]}'
  yield url
  for key in (paths.url_key(f'{url}/{name}') for name in ('data', 'train', 'bad', 'share', 'big')):
    shutil.rmtree(paths.cache_dir('stream', key), ignore_errors=True)


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
  return synthetic_data.write_wordpiece_vocab(str(tmp_path_factory.mktemp('vocab') / 'vocab.txt'), WORDS)


def _raw(directory, seed=0):
  """JSONL, .jsonl.gz, .jsonl.zst and Parquet inputs; returns the folder."""
  rng = np.random.default_rng(seed)
  docs = [' '.join(rng.choice(WORDS, rng.integers(1, 40))) for _ in range(400)]
  lines = lambda part: ''.join(json.dumps({'text': d}) + '\n' for d in part)
  (directory / 'sub').mkdir(parents=True)
  (directory / 'a.jsonl').write_text(lines(docs[:100]))
  (directory / 'b.jsonl').write_text(lines(docs[100:200]))
  (directory / 'sub' / 'c.jsonl.gz').write_bytes(gzip.compress(lines(docs[200:300]).encode()))
  (directory / 'sub' / 'd.jsonl.zst').write_bytes(zstandard.ZstdCompressor().compress(lines(docs[300:350]).encode()))
  pq.write_table(pa.table({'text': docs[350:]}), directory / 'sub' / 'e.parquet')
  return directory


def _upload_tree(local, url):
  for f in sorted(local.rglob('*')):
    if f.is_file():
      paths.copy(paths.Path(f), paths.Path(f'{url}/{f.relative_to(local).as_posix()}'))


def _prepare(inputs, output, vocab, **kw):
  return prepare_lib.prepare_local(
    inputs,
    output,
    tokenizer=vocab,
    max_length=16,
    workers=0,
    eval_fraction=0.2,
    shard_mb=kw.pop('shard_mb', 0.004),
    **kw,
  )


def _objects(url):
  return {p.name: p.read_bytes() for p in paths.Path(url).iterdir()}


def test_prepare_from_and_to_a_bucket_is_byte_identical_to_a_local_prepare(root, vocab, tmp_path, monkeypatch):
  raw = _raw(tmp_path / 'raw')
  _upload_tree(raw, f'{root}/raw')
  local = _prepare([f'{raw}/*.jsonl', f'{raw}/sub'], str(tmp_path / 'out'), vocab)
  remote = _prepare([f'{root}/raw/*.jsonl', f'{root}/raw/sub'], f'{root}/data', vocab)
  assert remote['input_files'] == [f.replace(str(raw), f'{root}/raw') for f in local['input_files']]
  made = remote['splits']['train']['shards']
  assert len(made) > 2 and all(len(s['sha256']) == 64 for s in made)
  on_bucket = _objects(f'{root}/data')
  here = {p.name: p.read_bytes() for p in (tmp_path / 'out').iterdir()}
  assert sorted(on_bucket) == sorted(here) == sorted(shards.Manifest.of(remote).files() + [shards.MANIFEST])
  for name in here:
    if name != shards.MANIFEST:
      assert on_bucket[name] == here[name], name
  a, b = json.loads(on_bucket[shards.MANIFEST]), json.loads(here[shards.MANIFEST])
  assert {k: v for k, v in a.items() if k not in RUN_FIELDS} == {k: v for k, v in b.items() if k not in RUN_FIELDS}
  assert on_bucket[shards.MANIFEST] == shards.Manifest.of(remote).text().encode()

  # Without --overwrite: refused before any work, nothing touched.
  with pytest.raises(FileExistsError, match='--overwrite'):
    _prepare([f'{root}/raw/a.jsonl'], f'{root}/data', vocab)
  assert _objects(f'{root}/data') == on_bucket
  # With it: fewer, larger shards; the old ones are removed only once the new manifest is up.
  seen_at_commit = []
  real_write = paths.write_text

  def spy(path, text):
    if path.name == shards.MANIFEST:
      seen_at_commit.extend(p.name for p in paths.Path(f'{root}/data').iterdir())
    real_write(path, text)

  monkeypatch.setattr(paths, 'write_text', spy)
  new = _prepare([f'{root}/raw/a.jsonl'], f'{root}/data', vocab, shard_mb=1, overwrite=True)
  listed = shards.Manifest.of(new).files()
  assert set(on_bucket) - {shards.MANIFEST} <= set(seen_at_commit)
  assert sorted(_objects(f'{root}/data')) == sorted(listed + [shards.MANIFEST])


def test_missing_bucket_is_one_line_before_tokenizing(vocab, tmp_path, monkeypatch, capsys, gcs):
  raw = _raw(tmp_path / 'raw')
  monkeypatch.setattr(prepare_lib, '_ordered_map', lambda *a: pytest.fail('tokenized before the output check'))
  with pytest.raises(SystemExit) as stop:
    prepare_lib.main(
      [
        '--input',
        str(raw),
        '--output',
        'gs://no-such-bucket/data',
        '--tokenizer',
        vocab,
        '--workers',
        '0',
        '--no-progress',
      ]
    )
  assert stop.value.code == errors.StorageError.exit_status
  err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
  assert len(err) == 1 and 'gs://no-such-bucket/data' in err[0], err


def test_training_on_bucket_data_matches_local_data(root, tmp_path):
  # Synthetic documents over a 1000-id vocabulary: the report's baselines cost grows with the vocabulary.
  local = str(tmp_path / 'local-data')
  docs = synthetic_data.synthetic_documents(200, seed=0, max_len=120, vocab_size=1000)
  held_out = synthetic_data.synthetic_documents(20, seed=1, max_len=120, vocab_size=1000)
  synthetic_data.write_prepared(local, docs, held_out, vocab_size=1000, max_length=128)
  publish.upload(local, paths.Path(f'{root}/train'), shards.Manifest.read(local))
  results = {}
  for name, data_dir in (('local', local), ('bucket', f'{root}/train')):
    cfg = tiny_config(vocab_size=1000, steps=3)
    cfg.data.dir = data_dir
    # the whole job on the bucket's data: training, then the report, which reads both splits through the cache
    result = (pretrain_job.pretrain if name == 'bucket' else train_only)(cfg, tmp_path / name)
    if name == 'bucket':
      assert result.report['unigram']['held_out'] > 0, result.report
    losses = [json.loads(x)['train/loss'] for x in (tmp_path / name / 'metrics.jsonl').read_text().splitlines()]
    results[name] = losses, runs.restore_params(tmp_path / name)[1]
  assert results['bucket'][0] == results['local'][0] and len(results['local'][0]) == 3
  for k, v in results['local'][1].items():
    np.testing.assert_array_equal(results['bucket'][1][k], v, err_msg=k)


def _data_cfg(url):
  cfg = data_config.default_data_config()
  cfg.dir, cfg.block_docs = url, 64
  return cfg


def test_damaged_shard_on_the_bucket_is_one_line_naming_it(root, vocab, tmp_path):
  made = _prepare([str(_raw(tmp_path / 'raw'))], f'{root}/bad', vocab)
  shard = made['splits']['train']['shards'][1]
  obj = paths.Path(f'{root}/bad/{shard["file"]}')
  good = obj.read_bytes()
  obj.write_bytes(good[:-10])  # truncated: its size on the bucket is checked before any download
  with pytest.raises(errors.DataError) as e:
    pipeline.make_train_iterator(_data_cfg(f'{root}/bad'), 4, 16, seed=0)
  assert f'{obj}: {len(good) - 10} bytes on the bucket' in str(e.value) and '\n' not in str(e.value)
  assert f'--output {root}/bad --overwrite' in str(e.value)
  obj.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])  # same size, one bit flipped: when fetched
  with pytest.raises(errors.DataError, match=f'{obj}: content differs from the manifest'):
    it = pipeline.make_train_iterator(_data_cfg(f'{root}/bad'), 4, 16, seed=0)
    for _ in range(200):
      next(it)
  obj.write_bytes(good)  # repaired: fetched again and read
  assert next(pipeline.make_train_iterator(_data_cfg(f'{root}/bad'), 4, 16, seed=0))['input_ids'].shape == (4, 16)


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_each_host_fetches_only_its_share_and_the_rows_are_the_single_hosts(root, vocab, tmp_path, monkeypatch):
  """Two hosts with caches of their own: each downloads about half the train shards, and their rows, side by
  side, are the rows of one host reading the local copy."""
  local = str(tmp_path / 'local')
  made = _prepare([str(_raw(tmp_path / 'raw'))], local, vocab, shard_mb=0.002)
  publish.upload(local, paths.Path(f'{root}/share'), shards.Manifest.of(made))
  listed = made['splits']['train']['shards']
  total = sum(s['bytes'] for s in listed)
  assert len(listed) >= 8
  cfg = _data_cfg(f'{root}/share')
  cfg.virtual_shards = 4
  its = []
  for p in range(2):
    monkeypatch.setenv('NEOBERT_JAX_CACHE', str(tmp_path / f'host{p}'))  # hosts share no disk
    its.append(pipeline.make_train_iterator(cfg, 4, 16, seed=0, process_index=p, process_count=2))
  hosts = [_take(it, 30) for it in its]
  ref_cfg = _data_cfg(local)
  ref_cfg.virtual_shards = 4
  ref = _take(pipeline.make_train_iterator(ref_cfg, 8, 16, seed=0), 30)
  for step, want in enumerate(ref):
    for k in want:
      np.testing.assert_array_equal(np.concatenate([hosts[0][step][k], hosts[1][step][k]]), want[k])
  got = [s.stats.bytes_downloaded for it in its for s in it.stores.values()]  # one source
  biggest = max(s['bytes'] for s in listed)
  for g in got:  # half of the corpus, plus at most the file each share's edge cuts
    assert 0 < g <= total / 2 + biggest, (got, total)
  files = [set(os.listdir(tmp_path / f'host{p}')) for p in range(2)]
  assert files[0] and files[1]


def test_a_corpus_larger_than_the_cache_budget_trains(root, vocab, tmp_path, monkeypatch):
  local = str(tmp_path / 'local')
  made = _prepare([str(_raw(tmp_path / 'raw'))], local, vocab, shard_mb=0.002)
  publish.upload(local, paths.Path(f'{root}/big'), shards.Manifest.of(made))
  listed = made['splits']['train']['shards']
  total = sum(s['bytes'] for s in listed)
  monkeypatch.setenv('NEOBERT_JAX_CACHE', str(tmp_path / 'cache'))
  cfg = _data_cfg(f'{root}/big')
  cfg.virtual_shards, cfg.shuffle_window = 2, 1
  cfg.block_docs = 16
  counts = [x['records'] for x in listed]
  streams = [
    virtual.ShardStream(virtual.pieces(counts, *r), seed=0, shard=v, window=1, shuffle=True)
    for v, r in enumerate(virtual.ranges(counts, 2))
  ]
  need = pipeline.cache_need(streams, listed, cfg.block_docs)
  cfg.cache_gb = need / 2**30  # exactly what the check asks for
  assert cfg.cache_gb * 2**30 < total  # the corpus does not fit
  it = pipeline.make_train_iterator(cfg, 4, 16, seed=0)
  ref_cfg = _data_cfg(local)
  ref_cfg.virtual_shards, ref_cfg.shuffle_window, ref_cfg.block_docs = 2, 1, 16
  ref = pipeline.make_train_iterator(ref_cfg, 4, 16, seed=0)
  for _ in range(300):  # epochs: every file is fetched, evicted and fetched again
    want, got = next(ref), next(it)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])
  (stats,) = [s.stats for s in it.stores.values()]
  assert stats.peak_disk_bytes <= cfg.cache_gb * 2**30 and stats.bytes_downloaded > total
  too_small = _data_cfg(f'{root}/big')
  too_small.virtual_shards, too_small.shuffle_window, too_small.block_docs = 2, 1, 16
  too_small.cache_gb = (need - 1) / 2**30
  with pytest.raises(errors.ConfigError, match='data.cache_gb=.* is too small .*raise data.cache_gb'):
    pipeline.make_train_iterator(too_small, 4, 16, seed=0)
