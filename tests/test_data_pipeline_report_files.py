"""A split read on one process (neobert_jax/data/pipeline/prepared.py): its files' local paths in manifest order,
or its documents, one file after the other, stopping after the file that reaches max_tokens. From a bucket:
tests/test_scenario_data_on_a_bucket.py and the held-out report's tests."""

import os

from neobert_jax.config import data as config_lib
from neobert_jax.data.pipeline import prepared
from tests.support import pipeline_data, synthetic_data


def test_a_splits_files_in_manifest_order_all_at_once_or_one_by_one(tmp_path):
  docs = synthetic_data.synthetic_documents(200, seed=0, max_len=120)
  manifest = synthetic_data.write_prepared(str(tmp_path), docs, docs[:80], shard_bytes=10_000, max_length=128)
  names = [s['file'] for s in manifest['splits']['eval']['shards']]
  assert len(names) > 1
  cfg = config_lib.default_data_config()
  cfg.dir = str(tmp_path)
  files, _ = pipeline_data.split_files(cfg, 128, 'eval')
  assert [os.path.basename(f) for f in files] == names and all(os.path.isfile(f) for f in files)
  first, _ = pipeline_data.split_files(cfg, 128, 'eval', max_files=1)
  assert [os.path.basename(f) for f in first] == names[:1]
  records, _ = prepared.read_heldout_split(cfg, 128, 'eval')
  assert [r.tolist() for r in records] == [list(d) for d in docs[:80]]
  sample, _ = prepared.read_heldout_split(cfg, 128, 'eval', max_tokens=1)
  first_file = manifest['splits']['eval']['shards'][0]['records']
  assert [r.tolist() for r in sample] == [list(d) for d in docs[:first_file]] and first_file < 80
