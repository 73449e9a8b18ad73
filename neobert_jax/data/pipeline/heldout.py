"""A prepared split's documents as token arrays, for the end-of-run report (its baselines and fill-mask): read on
one process from the split's start, each shard fetched from a bucket only when reached."""

from __future__ import annotations

import ml_collections
import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax.data import shards
from neobert_jax.data.pipeline.report_files import iter_split_files


def read_heldout_split(
  data_cfg: ml_collections.ConfigDict, seq_len: int, split: str, max_tokens: int | None = None
) -> tuple[list[np.ndarray], shards.Manifest]:
  """(the split's documents as int32 arrays in order, its manifest); at most ~max_tokens of them (a sample of a
  large train split, read 1024 records at a time so that no more is fetched)."""
  manifest, files = iter_split_files(data_cfg, seq_len, split)
  records, tokens, dtype = [], 0, manifest.id_dtype
  for path in files:
    if max_tokens is not None and tokens >= max_tokens:
      break  # before the next file is fetched
    reader = ArrayRecordReader(path)
    n = reader.num_records()
    step = 1024 if max_tokens is not None else max(n, 1)  # a whole split is read in one call
    for start in range(0, n, step):
      if max_tokens is not None and tokens >= max_tokens:
        break
      chunk = [shards.decode(r, dtype) for r in reader.read(range(start, min(start + step, n)))]
      records += chunk
      tokens += sum(c.size for c in chunk)
    reader.close()
  return records, manifest
