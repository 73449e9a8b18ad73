"""The bytes a mixture fetches from a bucket follow its weights, not its sources' sizes: two sources on a real GCS
server (the emulator), each cut into many small shard files, the smaller one weighted 0.75. They are read through a
proxy that counts the body bytes each object sends (tests/fault_proxy.py), by the trainer's own iterator
(make_train_iterator, with its prefetch thread) for a few hundred steps.

A bucket's shards are read as whole files, a window ahead of the reader (data/pipeline/store.py). A source of a
mixture fetches its next window only once its reader nears it, by its share of the rows (virtual.ShardBlocks
`ahead`), and a mixture fetches no first windows up front, so each source's files arrive as its rows consume them:
its bytes follow its weight, to within a window of files per virtual shard. Manifests are a fixed cost per source
and are left out.
"""

import json
import os
import shutil

import gcsfs
import numpy as np
import pytest
from fault_proxy import FaultProxy

from neobert_jax import paths
from neobert_jax.config import data as data_config
from tests.support import synthetic_data
from neobert_jax.data.pipeline import factories

pytestmark = [pytest.mark.server]

SEQ, VOCAB, BATCH, STEPS = 128, 30522, 32, 90
WEIGHTS = {'web': 0.75, 'books': 0.25}
# The lighter-weighted source is three times the larger. Every file costs an upload and a size check, most of the
# test's time, so the sources are two thirds of what they were: the steps fetch about 43 of web's files and 15 of
# books', neither source whole (measured).
DOCS = {'web': 6000, 'books': 18000}
SHARD_BYTES = 12 << 10  # ~80 documents a file: web 72 files, books 215
TOLERANCE = 0.05  # |byte share of the shard files - weight|: a file is the read unit
METADATA = 4 << 10  # the most an object's metadata (its size check) sends


def _publish(url: str, tmp_path) -> tuple[str, str, dict]:
  """The two sources prepared locally and uploaded; (the mixture file on the bucket, the same mixture read
  locally, {source: its train shards as listed})."""
  listed = {}
  for i, name in enumerate(WEIGHTS):
    docs = synthetic_data.synthetic_documents(DOCS[name], seed=i, min_len=20, max_len=SEQ, vocab_size=VOCAB)
    local = str(tmp_path / name)
    manifest = synthetic_data.write_prepared(
      local, docs, docs[:50], vocab_size=VOCAB, max_length=SEQ, shard_bytes=SHARD_BYTES
    )
    listed[name] = manifest['splits']['train']['shards']
    paths.publish_dir(local, paths.resolve(f'{url}/{name}'), 'manifest.json')
  body = json.dumps({n: {'dir': n, 'weight': w} for n, w in WEIGHTS.items()})
  paths.resolve(f'{url}/mix.json').write_text(body)
  (tmp_path / 'mix.json').write_text(body)
  return f'{url}/mix.json', str(tmp_path / 'mix.json'), listed


def _config(mixture: str):
  cfg = data_config.default_data_config()
  cfg.mixture, cfg.virtual_shards, cfg.block_docs, cfg.shuffle_window = mixture, 2, 64, 1
  return cfg


def _sent(gcs, url, remote, monkeypatch, steps: int):
  """({source: {its train- object: bytes it sent}}, the batches) of `steps` steps."""
  from conftest import gcs_env

  prefix = url.removeprefix(f'{gcs}/')
  for source in WEIGHTS:  # this machine's cached copies of both sources, so every byte comes through the proxy
    shutil.rmtree(paths.cache_dir('stream', paths.url_key(paths.resolve(f'{url}/{source}'))), ignore_errors=True)
  proxy = FaultProxy(os.environ['STORAGE_EMULATOR_HOST'])
  try:
    for k, v in gcs_env(proxy.url).items():
      monkeypatch.setenv(k, v)
    gcsfs.GCSFileSystem.clear_instance_cache()  # epath's filesystem was made for the server itself
    it = factories.make_train_iterator(_config(remote), BATCH, SEQ, 0)
    batches = [next(it) for _ in range(steps)]
    for s in it.stores.values():
      s.close()
  finally:
    proxy.close()
    monkeypatch.undo()
    gcsfs.GCSFileSystem.clear_instance_cache()
  sent = {n: {k: v for k, v in proxy.sent.items() if k.startswith(f'{prefix}/{n}/train-')} for n in WEIGHTS}
  return sent, batches


def test_the_bytes_each_source_sends_follow_the_weights(gcs, tmp_path, monkeypatch):
  url = f'{gcs}/mixture-bytes'
  remote, local, listed = _publish(url, tmp_path)
  objects, batches = _sent(gcs, url, remote, monkeypatch, STEPS)
  size = {n: {s['file']: s['bytes'] for s in listed[n]} for n in WEIGHTS}
  # Every listed file's size is checked on the bucket before a byte moves (its metadata, ~1.6 KB a request); the
  # files fetched are sent whole, once.
  fetched = {n: {k: v for k, v in o.items() if v > METADATA} for n, o in objects.items()}
  for n in WEIGHTS:
    assert all(0 <= v - size[n][k.rsplit('/', 1)[1]] < METADATA for k, v in fetched[n].items()), fetched[n]
  sent = {n: sum(size[n][k.rsplit('/', 1)[1]] for k in o) for n, o in fetched.items()}
  whole = {n: sum(s['bytes'] for s in listed[n]) for n in WEIGHTS}
  print('shard bytes sent', sent, 'of', whole, 'files', {n: f'{len(fetched[n])} of {len(listed[n])}' for n in WEIGHTS})
  assert sent['web'] < whole['web'] and sent['books'] < whole['books'] / 4  # neither was read whole
  for n, w in WEIGHTS.items():
    assert abs(sent[n] / sum(sent.values()) - w) < TOLERANCE, (n, sent[n] / sum(sent.values()), w)
  # What was fetched does not change what is read: the same rows as the mixture read in place.
  ref = factories.make_train_iterator(_config(local), BATCH, SEQ, 0)
  for b in batches[:5]:
    assert np.array_equal(next(ref)['input_ids'], b['input_ids'])
