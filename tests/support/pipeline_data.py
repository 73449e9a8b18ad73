"""What the data pipeline's tests share (tests/test_data_pipeline_*.py, tests/test_data_elastic.py): a prepared
synthetic corpus, its data config, and batches taken and compared."""

import os

import numpy as np

from neobert_jax.config import data as config_lib
from neobert_jax.data.pipeline import prepared
from tests.support import synthetic_data

N_DOCS = 600  # 600 documents of up to 120 ids: an epoch is about 35 batches of 8 rows of 128


def write_corpus(tmp_path_factory, eval_docs: int = 40) -> str:
  """N_DOCS training documents (and `eval_docs` held-out ones) in small shards, so documents come from several
  files; returns the directory."""
  d = str(tmp_path_factory.mktemp('prepared'))
  docs = synthetic_data.synthetic_documents(N_DOCS, seed=0, max_len=120)
  evals = synthetic_data.synthetic_documents(eval_docs, seed=1, max_len=120)
  synthetic_data.write_prepared(d, docs, evals, shard_bytes=40_000, max_length=128)
  return d


def data_cfg(data_dir: str, **kw):
  cfg = config_lib.default_data_config()
  cfg.dir = data_dir
  cfg.block_docs = 64
  cfg.update(kw)
  return cfg


def take(it, n: int) -> list[dict]:
  return [next(it) for _ in range(n)]


def global_batches(its, steps: int) -> list[dict]:
  """What a job's global batches hold, from the iterators of its processes: process p's rows at [p*b, (p+1)*b)."""
  out = []
  for _ in range(steps):
    parts = [next(it) for it in its]
    out.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
  return out


def same(a: list[dict], b: list[dict]) -> bool:
  return len(a) == len(b) and all(
    x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
  )


def split_files(data_cfg, seq_len: int, split: str, max_files: int | None = None):
  """(local paths of the first `max_files` shards of a split, manifest), fetched from a bucket (the data benchmark's
  download figure)."""
  directory, manifest = prepared.open_prepared(data_cfg, seq_len)
  listed = prepared.split_shards(directory, manifest, split)[:max_files]
  store = prepared.open_store(directory, manifest, split, listed, float('inf'), 0)
  store.acquire([s['file'] for s in listed])
  return [os.path.join(store.dir, s['file']) for s in listed], manifest
