"""The bytes a mixture fetches from a bucket follow its weights: two sources of the same size on a real GCS server
(the emulator), read through a proxy that counts the body bytes each object sends (tests/fault_proxy.py), weights
0.75 / 0.25, the trainer's own iterator (make_train_iterator, with its prefetch thread) for a few hundred steps.

A source's read unit is one window of shard files per virtual shard (docs/data.md, "Several sources"), so the shares
converge once each source holds several files per virtual shard: here ~14 files of ~250 KB (about 3.5 MB) per
source and 2 virtual shards. Manifests are a fixed cost per source and are left out of the shares.
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
from support import synthetic_data
from neobert_jax.data.pipeline import factories

pytestmark = [pytest.mark.server]

SEQ, VOCAB, BATCH, STEPS = 128, 30522, 32, 200
WEIGHTS = {'web': 0.75, 'books': 0.25}
TOLERANCE = 0.06  # |byte share - weight|; the read unit (one ~250 KB file per virtual shard) bounds it


def _publish(url: str, tmp_path) -> tuple[str, str]:
  """The two sources prepared locally and uploaded; (the mixture file on the bucket, the same mixture read
  locally)."""
  for i, name in enumerate(WEIGHTS):
    docs = synthetic_data.synthetic_documents(12000, seed=i, min_len=20, max_len=SEQ, vocab_size=VOCAB)
    local = str(tmp_path / name)
    synthetic_data.write_prepared(local, docs, docs[:50], vocab_size=VOCAB, max_length=SEQ, shard_bytes=128 << 10)
    paths.publish_dir(local, paths.resolve(f'{url}/{name}'), 'manifest.json')
  body = json.dumps({n: {'dir': n, 'weight': w} for n, w in WEIGHTS.items()})
  paths.resolve(f'{url}/mix.json').write_text(body)
  (tmp_path / 'mix.json').write_text(body)
  return f'{url}/mix.json', str(tmp_path / 'mix.json')


def _config(mixture: str):
  cfg = data_config.default_data_config()
  cfg.mixture, cfg.virtual_shards, cfg.block_docs, cfg.shuffle_window = mixture, 2, 64, 1
  return cfg


def test_the_bytes_each_source_sends_follow_the_weights(gcs, tmp_path, monkeypatch):
  from conftest import gcs_env

  url = f'{gcs}/mixture-bytes'
  remote, local = _publish(url, tmp_path)
  prefix = url.removeprefix(f'{gcs}/')
  for source in ('web', 'books'):  # this machine's cached copies of both sources, so every byte comes through the proxy
    shutil.rmtree(paths.cache_dir('stream', paths.url_key(paths.resolve(f'{url}/{source}'))), ignore_errors=True)
  proxy = FaultProxy(os.environ['STORAGE_EMULATOR_HOST'])
  try:
    for k, v in gcs_env(proxy.url).items():
      monkeypatch.setenv(k, v)
    gcsfs.GCSFileSystem.clear_instance_cache()  # epath's filesystem was made for the server itself
    it = factories.make_train_iterator(_config(remote), BATCH, SEQ, 0)
    batches = [next(it) for _ in range(STEPS)]
    read = {n: it.store[n].stats.bytes_read for n in WEIGHTS}
    for s in it.store.values():
      s.close()
  finally:
    proxy.close()
    monkeypatch.undo()
    gcsfs.GCSFileSystem.clear_instance_cache()
  sent = {n: proxy.bytes_under(f'{prefix}/{n}/train-') for n in WEIGHTS}
  total = sum(sent.values())
  whole = {
    n: sum(s['bytes'] for s in json.loads((tmp_path / n / 'manifest.json').read_text())['splits']['train']['shards'])
    for n in WEIGHTS
  }
  print(
    'bytes sent', sent, 'of', whole, 'record bytes read', read, 'manifests', proxy.bytes_under(f'{prefix}/web/manifest')
  )
  assert all(sent[n] < whole[n] for n in WEIGHTS)  # neither source was read whole
  for n, w in WEIGHTS.items():
    assert abs(sent[n] / total - w) < TOLERANCE, (n, sent[n] / total, w)
  # What was fetched does not change what is read: the same rows as the mixture read in place.
  ref = factories.make_train_iterator(_config(local), BATCH, SEQ, 0)
  for b in batches[:5]:
    assert np.array_equal(next(ref)['input_ids'], b['input_ids'])
