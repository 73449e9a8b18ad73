"""Staging prepared data into the machine's cache (data/pipeline/staging.py), without a server: the same code that
copies a bucket's data copies a directory given by path, so the checks of the copy are tested here in the fast
subset (the bucket itself: tests/test_storage_data.py, marked server)."""

import json
import os

from neobert_jax import paths
from neobert_jax.data import shards, testing
from neobert_jax.data.pipeline import staging
from neobert_jax.data.prepare import local as prepare_lib


def test_a_copy_cut_short_or_damaged_is_staged_again_and_checked(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv('NEOBERT_JAX_CACHE', str(tmp_path / 'cache'))
  vocab = testing.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), ('the', 'cat', 'sat', 'on', 'mat'))
  (tmp_path / 'a.jsonl').write_text(
    ''.join(json.dumps({'text': 'the cat sat on the mat ' * k}) + '\n' for k in range(60))
  )
  source = tmp_path / 'data'
  manifest = prepare_lib.prepare(
    [str(tmp_path / 'a.jsonl')], str(source), tokenizer=vocab, max_length=16, workers=0, shard_mb=0.004
  )
  local = staging.stage(paths.Path(source))
  files = sorted(s['file'] for split in manifest['splits'].values() for s in split['shards'])
  assert len(files) > 2 and sorted(os.listdir(local)) == sorted(files + [shards.MANIFEST])
  assert shards.read_manifest(local) == manifest
  assert 'staging' in capsys.readouterr().err
  staging.stage(paths.Path(source))
  assert 'staging' not in capsys.readouterr().err  # a current copy is used as it is

  # A copy cut short (no local manifest, its commit marker) with a damaged shard: staged again, the damaged shard
  # downloaded again (its sha256 no longer matches), every file equal to the source's.
  os.remove(os.path.join(local, shards.MANIFEST))
  with open(os.path.join(local, files[0]), 'r+b') as f:
    f.write(b'\0' * 8)
  assert staging.stage(paths.Path(source)) == local
  assert 'staging' in capsys.readouterr().err
  for name in files + [shards.MANIFEST]:
    assert open(os.path.join(local, name), 'rb').read() == (source / name).read_bytes(), name
