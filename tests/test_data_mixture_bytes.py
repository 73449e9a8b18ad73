"""The bytes a mixture fetches from a bucket follow its weights, not its sources' sizes: two sources on a real GCS
server (the emulator), each one shard file as `prepare` writes a small source, the smaller one weighted 0.75. They
are read through a proxy that counts the body bytes each object sends (tests/fault_proxy.py), by the trainer's own
iterator (make_train_iterator, with its prefetch thread) for a few hundred steps.

A mixture's sources are read record by record (data.bucket_reads='auto', data/pipeline/ranged.py), so each sends its
records' chunks, and its files' record indexes whole (a fixed part, under 1% of the files, checked apart). Whole-file reads (data.bucket_reads='files') send both files whole at
the first step: that is checked too, as the contrast. Manifests are a fixed cost per source and are left out.
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

SEQ, VOCAB, BATCH, STEPS = 128, 30522, 32, 120
WEIGHTS = {'web': 0.75, 'books': 0.25}
DOCS = {'web': 9000, 'books': 27000}  # the lighter-weighted source is three times the larger
TOLERANCE = 0.02  # |byte share of the shard files - weight|: a block of block_docs documents is the read unit


def _publish(url: str, tmp_path) -> tuple[str, str]:
  """The two sources prepared locally and uploaded; (the mixture file on the bucket, the same mixture read
  locally)."""
  for i, name in enumerate(WEIGHTS):
    docs = synthetic_data.synthetic_documents(DOCS[name], seed=i, min_len=20, max_len=SEQ, vocab_size=VOCAB)
    local = str(tmp_path / name)
    synthetic_data.write_prepared(local, docs, docs[:50], vocab_size=VOCAB, max_length=SEQ)  # one file each
    paths.publish_dir(local, paths.resolve(f'{url}/{name}'), 'manifest.json')
  body = json.dumps({n: {'dir': n, 'weight': w} for n, w in WEIGHTS.items()})
  paths.resolve(f'{url}/mix.json').write_text(body)
  (tmp_path / 'mix.json').write_text(body)
  return f'{url}/mix.json', str(tmp_path / 'mix.json')


def _config(mixture: str, reads: str = 'auto', block_docs: int = 64):
  cfg = data_config.default_data_config()
  cfg.mixture, cfg.virtual_shards, cfg.block_docs, cfg.bucket_reads = mixture, 2, block_docs, reads
  return cfg


def _sent(gcs, url, remote, monkeypatch, reads: str, steps: int, block_docs: int = 64):
  """({source: {its train- object: bytes it sent}}, the batches, {source: its store's stats}) of `steps` steps."""
  from conftest import gcs_env

  prefix = url.removeprefix(f'{gcs}/')
  for source in WEIGHTS:  # this machine's cached copies of both sources, so every byte comes through the proxy
    shutil.rmtree(paths.cache_dir('stream', paths.url_key(paths.resolve(f'{url}/{source}'))), ignore_errors=True)
  proxy = FaultProxy(os.environ['STORAGE_EMULATOR_HOST'])
  try:
    for k, v in gcs_env(proxy.url).items():
      monkeypatch.setenv(k, v)
    gcsfs.GCSFileSystem.clear_instance_cache()  # epath's filesystem was made for the server itself
    it = factories.make_train_iterator(_config(remote, reads, block_docs), BATCH, SEQ, 0)
    batches = [next(it) for _ in range(steps)]
    stats = {n: it.stores[n].stats for n in WEIGHTS}
    for s in it.stores.values():
      s.close()
  finally:
    proxy.close()
    monkeypatch.undo()
    gcsfs.GCSFileSystem.clear_instance_cache()
  sent = {n: {k: v for k, v in proxy.sent.items() if k.startswith(f'{prefix}/{n}/train-')} for n in WEIGHTS}
  return sent, batches, stats


def test_the_bytes_each_source_sends_follow_the_weights(gcs, tmp_path, monkeypatch):
  url = f'{gcs}/mixture-bytes'
  remote, local = _publish(url, tmp_path)
  objects, batches, stats = _sent(gcs, url, remote, monkeypatch, 'auto', STEPS)
  sent = {n: sum(v for k, v in o.items() if not k.endswith('.index')) for n, o in objects.items()}
  index = {n: sum(v for k, v in o.items() if k.endswith('.index')) for n, o in objects.items()}
  total = sum(sent.values())
  whole = {
    n: sum(s['bytes'] for s in json.loads((tmp_path / n / 'manifest.json').read_text())['splits']['train']['shards'])
    for n in WEIGHTS
  }
  print(
    'shard bytes sent',
    sent,
    'of',
    whole,
    'index bytes',
    index,
    'record bytes read',
    {n: s.bytes_read for n, s in stats.items()},
  )
  assert sent['web'] < whole['web'] and sent['books'] < whole['books'] / 4  # neither was read whole
  for n, w in WEIGHTS.items():
    assert abs(sent[n] / total - w) < TOLERANCE, (n, sent[n] / total, w)
    assert 0 < index[n] < whole[n] / 100  # the fixed part: each file's record index, read whole
  # What was fetched does not change what is read: the same rows as the mixture read in place.
  ref = factories.make_train_iterator(_config(local), BATCH, SEQ, 0)
  for b in batches[:5]:
    assert np.array_equal(next(ref)['input_ids'], b['input_ids'])
  # From the first step, at the default data.block_docs (4096, more than a virtual shard of either source holds):
  # the blocks are in proportion to the weights and no larger than a quarter of the lighter-read source's shard, so
  # the first blocks, read whole at the start, follow the weights too (4096-document blocks would read both whole).
  early = _sent(gcs, url, remote, monkeypatch, 'auto', 2, block_docs=4096)[0]
  early = {n: sum(v for k, v in o.items() if not k.endswith('.index')) for n, o in early.items()}
  assert early['web'] < whole['web'] / 3
  for n, w in WEIGHTS.items():
    assert abs(early[n] / sum(early.values()) - w) < 0.05, (n, early, w)
  print('first two steps: shard bytes sent', early)
  # The contrast: whole files send each source whole at the first step, so their bytes follow the sizes.
  files, first, _ = _sent(gcs, url, remote, monkeypatch, 'files', 1)
  for n in WEIGHTS:  # each file whole, plus the metadata of its size check
    assert whole[n] <= sum(files[n].values()) < whole[n] + (16 << 10), (n, files[n], whole[n])
  assert np.array_equal(first[0]['input_ids'], batches[0]['input_ids'])
