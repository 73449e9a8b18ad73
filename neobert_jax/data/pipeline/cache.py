"""Sizing the bucket cache: what one process must be able to hold for its virtual shards, checked when its store
opens so that a budget too small is one line at start, not an eviction loop mid-run.
"""

import ml_collections

from neobert_jax import errors


def cache_need(streams: list, listed: list[dict], block_docs: int) -> int:
  """Bytes a process must be able to hold: per virtual shard, the windows one block can touch plus the next one."""
  need = 0
  for st in streams:
    sizes = [sum(listed[p.file]['bytes'] for p in w) for w in st.windows]
    records = min(sum(p.size for p in w) for w in st.windows)
    span = min(len(sizes), -(-block_docs // max(records, 1)) + 1) + 1
    need += sum(sorted(sizes, reverse=True)[:span])
  return need


def check_cache(store, streams: list, listed: list[dict], data_cfg: ml_collections.ConfigDict) -> None:
  """ConfigError when a bucket store's budget (data.cache_gb) cannot hold what `cache_need` says; nothing to
  check for a store that keeps no files (data read in place)."""
  if not store.caches:
    return
  need = cache_need(streams, listed, data_cfg.block_docs)
  if need > store.budget:
    raise errors.ConfigError(
      f"data.cache_gb={data_cfg.cache_gb:.6g} is too small for this process's {len(streams)} virtual shard(s): "
      f'the windows one block of data.block_docs={data_cfg.block_docs} documents touches, and the next, need '
      f'{need / 2**30:.6g} GiB; raise data.cache_gb, or lower data.shuffle_window or data.block_docs'
    )
