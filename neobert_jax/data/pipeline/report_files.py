"""A split's shard files, as local paths, for reports that read a split on one process (the held-out report, the
loss curve's token counts): fetched from a bucket when the data lives there, like the training pipeline's reads.
"""

import ml_collections

from neobert_jax.data.pipeline import prepared


def split_files(data_cfg: ml_collections.ConfigDict, seq_len: int, split: str, max_files: int | None = None):
  """Local paths of the first `max_files` shards of a split (all by default), fetched if the data is on a bucket;
  for reports that read a split whole on one process."""
  directory, manifest = prepared.open_prepared(data_cfg, seq_len)
  listed = prepared.split_shards(directory, manifest, split)[:max_files]
  store = prepared.open_store(directory, manifest, split, listed, float('inf'), 0)
  store.acquire([s['file'] for s in listed])
  return [store.local_path(s['file']) for s in listed], manifest


def iter_split_files(data_cfg: ml_collections.ConfigDict, seq_len: int, split: str):
  """(manifest, the local paths of a split's shards in order), each fetched only when the reader reaches it if the
  data is on a bucket, and released after, so the cache budget holds; for a report that reads a split from its start
  on one process and may stop early."""
  directory, manifest = prepared.open_prepared(data_cfg, seq_len)
  listed = prepared.split_shards(directory, manifest, split)
  store = prepared.open_store(directory, manifest, split, listed, data_cfg.cache_gb, 0)  # reports run on process 0

  def files():
    for shard in listed:
      store.acquire([shard['file']])
      try:
        yield store.local_path(shard['file'])
      finally:
        store.release([shard['file']])

  return manifest, files()
