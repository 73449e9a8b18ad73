"""Two hosts train on a two-source mixture whose sources and file live on a bucket (a real GCS server): each host
reads only its share of each source into its own cache, and a job whose process 1 vanishes (as under kill -9) and is
run again ends bit for bit where the uninterrupted two-host job does. The job is tests/test_scenario_multihost_training.py's
(its bucket_job: hosts without a shared path), with the mixture passed as config overrides."""

from __future__ import annotations

import json

import pytest
from test_scenario_multihost_training import bucket_job

from neobert_jax import paths
from tests.support import synthetic_data

pytestmark = [pytest.mark.multiprocess, pytest.mark.server]

VOCAB, SEQ = 2048, 64


def _publish_sources(url: str, tmp_path) -> str:
  """Two synthetic sources prepared locally, uploaded, and a mixture file next to them; returns its URL."""
  for i, name in enumerate(('web', 'books')):
    docs = synthetic_data.synthetic_documents(300, seed=i, min_len=5, max_len=60, vocab_size=VOCAB)
    local = str(tmp_path / 'prepared' / name)
    synthetic_data.write_prepared(local, docs[:270], docs[270:], vocab_size=VOCAB, max_length=SEQ)
    paths.publish_dir(local, paths.resolve(f'{url}/{name}'), 'manifest.json')
  mix = f'{url}/mix.json'
  paths.resolve(mix).write_text(
    json.dumps({'web': {'dir': 'web', 'weight': 0.7}, 'books': {'dir': 'books', 'weight': 0.3}})
  )
  return mix


def test_two_hosts_read_their_shares_of_a_mixture_from_a_bucket_and_resume_exactly(gcs, tmp_path):
  from neobert_jax.weights import runs

  mix = _publish_sources(f'{gcs}/mixture-multihost', tmp_path)
  extra = {
    'data.mixture': mix,
    'data.tokenizer': '',
    'model.vocab_size': VOCAB,
    'checkpoint.every_steps': 1,
    'eval.every_steps': 3,
    'eval.num_batches': 1,
    'eval.probe_task': '',  # the probe needs a real tokenizer; these sources are synthetic ids
  }
  whole = f'{gcs}/runs/mixture-whole'
  # the reference saves only its last step: a checkpoint on the bucket costs seconds and changes no parameter
  codes, out = bucket_job(whole, dict(extra, **{'checkpoint.every_steps': 3}), tmp_path, {})
  assert codes == [0, 0] and 'final_step=3' in out, out[-3000:]
  rows = [json.loads(x) for x in paths.resolve(f'{whole}/metrics.jsonl').read_text().splitlines() if x.strip()]
  held = [r for r in rows if 'eval/loss' in r][-1]  # the weights' row (the recipe's moving average has its own)
  assert {'eval/web/loss', 'eval/books/loss', 'eval/loss'} <= set(held), held
  for pid in range(2):  # each host fetched only its own shard files of each source, into its own cache
    assert (tmp_path / f'host{pid}' / 'cache' / 'stream').is_dir()
  broken = f'{gcs}/runs/mixture-broken'
  codes, out = bucket_job(broken, extra, tmp_path, {'TEST_DIE_AT_STEP': '2'})
  assert codes[1] != 0 and 'process 1 dying after step 2' in out, out[-3000:]
  codes, out = bucket_job(broken, extra, tmp_path, {})
  assert codes == [0, 0] and 'final_step=3' in out, out[-3000:]
  _, ours = runs.restore_params(broken)
  _, ref = runs.restore_params(whole)
  assert sorted(ours) == sorted(ref)
  for k in ref:
    assert (ours[k] == ref[k]).all(), k
