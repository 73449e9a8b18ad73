"""Record indexes (data/record_index.py) and the record-by-record bucket store (data/pipeline/ranged.py).

The index is checked against ArrayRecord's own reader on a shard whose records cross riegeli's 64 KiB block headers,
including an empty record; the store against the local read of the same shard through a real GCS server (the
emulator); damage and data without indexes are one line each.
"""

import json
import os
import shutil

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax import errors, paths
from neobert_jax.config import data as data_config
from neobert_jax.data import record_index, shards
from neobert_jax.data.pipeline import prepared, ranged
from tests.support import synthetic_data


def _shard(tmp_path, n=1500, seed=0):
  """One shard of `n` records of 0 to ~1400 bytes (many cross a block header; record 7 is empty)."""
  rng = np.random.default_rng(seed)
  w = shards.ShardWriter(str(tmp_path), 'train', 1 << 30, id_dtype='uint16')
  docs = [rng.integers(5, 30000, int(rng.integers(1, 700))) for _ in range(n)]
  docs[7] = docs[7][:0]
  for d in docs:
    w.write_document([d])
  return w.close()['shards'][0], docs


def test_the_index_finds_every_record_as_arrayrecord_reads_it(tmp_path):
  shard, docs = _shard(tmp_path)
  path = str(tmp_path / shard['file'])
  raw = (tmp_path / shard['index']['file']).read_bytes()
  assert len(raw) == shard['index']['bytes'] < shard['bytes'] / 100  # deflated chunk sizes: ~1-2 bytes a record
  begins = record_index.parse(raw, 'index', shard['records'])
  data = open(path, 'rb').read()
  crossing = sum(1 for a, b in zip(begins[:-1], begins[1:]) if a // record_index.BLOCK != (b - 1) // record_index.BLOCK)
  assert crossing > 10  # the block headers inside records are exercised
  reader = ArrayRecordReader(path)
  expected = reader.read_all()
  reader.close()
  for i, rec in enumerate(expected):
    a, b = int(begins[i]), int(begins[i + 1])
    got = record_index.record_of(data[a:b], a, b, path)
    assert got == rec == np.asarray(docs[i], '<u2').tobytes()


def test_bytes_from_the_wrong_place_are_an_error_not_a_record(tmp_path):
  shard, _ = _shard(tmp_path, n=200)
  path = str(tmp_path / shard['file'])
  data = open(path, 'rb').read()
  begins = record_index.parse((tmp_path / shard['index']['file']).read_bytes(), 'index', shard['records'])
  a, b = int(begins[3]), int(begins[4])
  with pytest.raises(errors.DataError, match='not one record chunk'):
    record_index.record_of(data[a + 2 : b + 2], a + 2, b + 2, path)  # an index two bytes off
  with pytest.raises(errors.DataError, match='returned 5 of'):
    record_index.record_of(data[a : a + 5], a, b, path)  # a short read
  with pytest.raises(errors.DataError, match='damaged'):
    record_index.parse(record_index.encode(begins[:-1]), 'index', shard['records'])
  with pytest.raises(errors.DataError, match='unreadable index'):
    record_index.parse(b'not an index', 'index', shard['records'])


def _publish(tmp_path, url, n=3000, vocab=30522):
  docs = synthetic_data.synthetic_documents(n, seed=3, min_len=2, max_len=600, vocab_size=vocab)
  local = str(tmp_path / 'local')
  manifest = synthetic_data.write_prepared(local, docs, docs[:20], shard_bytes=256 << 10, vocab_size=vocab)
  paths.publish_dir(local, paths.resolve(url), 'manifest.json')
  return local, manifest


@pytest.mark.server
def test_a_bucket_read_record_by_record_gives_the_local_records(gcs, tmp_path):
  url = f'{gcs}/record-index'
  local, manifest = _publish(tmp_path, url)
  listed = manifest['splits']['train']['shards']
  assert len(listed) > 2 and ranged.indexed(listed)
  store = ranged.RecordStore(paths.resolve(url), listed)
  rng = np.random.default_rng(0)
  try:
    for shard in listed[:3]:
      store.acquire([shard['file']])
      want = rng.permutation(shard['records'])[:300].tolist() + [0, 1, 2]  # neighbours merge into one range
      reader = ArrayRecordReader(os.path.join(local, shard['file']))
      assert store.read(shard['file'], want) == reader.read(want)
      reader.close()
      store.release([shard['file']])
    used = sum(s['index']['bytes'] for s in listed[:3])
    record_bytes = store.stats.bytes_downloaded - used
    assert store.stats.bytes_read < record_bytes < store.stats.bytes_read + 60 * 3 * 303  # chunks' framing
    assert store.stats.requests < 3 * 303
  finally:
    store.close()


@pytest.mark.server
def test_a_damaged_index_or_data_without_indexes_is_one_line(gcs, tmp_path):
  url = f'{gcs}/record-index-damaged'
  local, manifest = _publish(tmp_path, url, n=600)
  listed = manifest['splits']['train']['shards']
  shard = listed[0]
  index_url = paths.resolve(url) / shard['index']['file']
  good = index_url.read_bytes()
  index_url.write_bytes((tmp_path / 'local' / listed[1]['index']['file']).read_bytes())  # another file's index
  with pytest.raises(errors.DataError, match=r'\.index: \d+ bytes on the bucket, manifest says'):
    ranged.RecordStore(paths.resolve(url), [shard])  # checked before a record is read
  index_url.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, one bit flipped
  store = ranged.RecordStore(paths.resolve(url), [shard])
  try:
    with pytest.raises(errors.DataError, match=r'\.index: content differs from the manifest \(sha256\)'):
      store.acquire([shard['file']])
  finally:
    store.close()
  # Data prepared before indexes: 'records' names the fix; 'auto' reads such a source as whole files.
  old = json.loads(json.dumps(manifest))
  for s in old['splits']['train']['shards']:
    del s['index']
  with pytest.raises(errors.DataError, match='prepare it again, or set data.bucket_reads=files'):
    prepared.open_store(url, old, 'train', old['splits']['train']['shards'], 1.0, 0, records=True)
  cfg = data_config.default_data_config()  # bucket_reads='auto'
  assert not prepared.reads_records(cfg, url, old['splits']['train']['shards'], in_mixture=True)
  assert prepared.reads_records(cfg, url, listed, in_mixture=True)
  assert not prepared.reads_records(cfg, url, listed, in_mixture=False)
  assert not prepared.reads_records(cfg, local, listed, in_mixture=True)
  shutil.rmtree(local)
  # A manifest whose index entry is damaged into other valid JSON is one line naming it.
  bad = json.loads(json.dumps(manifest))
  bad['splits']['train']['shards'][0]['index'] = {'file': 3}
  with pytest.raises(errors.DataError, match='damaged manifest'):
    shards.Manifest.parse(json.dumps(bad).encode(), url)


@pytest.mark.server
def test_the_report_reads_no_training_text_of_a_source_read_record_by_record(gcs, tmp_path, caplog, monkeypatch):
  from neobert_jax.train import baselines

  url = f'{gcs}/record-index-report'
  _publish(tmp_path, url, n=400, vocab=2048)  # a small vocabulary: the neighbour counts take 1 s, not 40
  paths.resolve(f'{url}/mix.json').write_text(json.dumps({'only': {'dir': url, 'weight': 1.0}}))
  cfg = data_config.default_data_config()
  cfg.mixture = f'{url}/mix.json'
  monkeypatch.setenv('NEOBERT_JAX_CACHE', str(tmp_path / 'cache'))  # nothing cached from an earlier run
  with caplog.at_level('INFO', logger='neobert_jax.train'):
    assert baselines.source_baselines(cfg, 1024, 0.2, 'auto') == {}
  assert "source 'only': no baselines (its training split is read record by record" in caplog.text
  bars = baselines.source_baselines(cfg, 1024, 0.2, 'on')['only']
  assert set(bars) == {'held_out', 'train', 'neighbours'}
  assert baselines.source_baselines(cfg, 1024, 0.2, 'auto') == {'only': bars}  # cached now: read back, nothing read
  assert baselines.source_baselines(cfg, 1024, 0.2, 'off') == {}
