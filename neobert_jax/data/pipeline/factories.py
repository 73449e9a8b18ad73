"""The two ways training reads prepared data: this host's endless training batches, and the held-out batches.

Virtual shards (virtual.py) read through a shard store (store.py) -> blocks of `block_docs` documents, packed and
masked by BlockBuilder with randomness from (seed, virtual shard, block index) alone, so a block is the same
whichever process or worker builds it -> each step's rows drawn from the sources (host_batches.py) -> optional
mp_prefetch workers or a prefetch thread. Batches are numpy dicts per host (batch.py).
"""

import grain
import ml_collections
import numpy as np

from neobert_jax import errors, paths
from neobert_jax.config import data as data_config
from neobert_jax.data import shards
from neobert_jax.data.pipeline import host_batches
from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import packing
from neobert_jax.data.pipeline import prepared
from neobert_jax.data.pipeline import store as store_lib
from neobert_jax.data.pipeline import virtual


def _data_seed(data_cfg: ml_collections.ConfigDict, seed: int) -> int:
  """The data's seed: data.shuffle_seed, or the run's seed when it is negative (training and held-out alike)."""
  return seed if data_cfg.shuffle_seed < 0 else data_cfg.shuffle_seed


def cache_need(streams: list, listed: list[dict], block_docs: int) -> int:
  """Bytes a process must be able to hold: per virtual shard, the windows one block can touch plus the next one."""
  need = 0
  for st in streams:
    sizes = [sum(listed[p.file]['bytes'] for p in w) for w in st.windows]
    records = min(sum(p.size for p in w) for w in st.windows)
    span = min(len(sizes), -(-block_docs // max(records, 1)) + 1) + 1
    need += sum(sorted(sizes, reverse=True)[:span])
  return need


def make_train_iterator(
  data_cfg: ml_collections.ConfigDict,
  batch_size_per_host: int,
  seq_len: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  *,
  model_vocab_size: int | None = None,
  prefetch: int = 2,
  sources: prepared.Sources | None = None,
) -> grain.DatasetIterator:
  """Endless iterator of this host's training batches, with get_state/set_state (position.py). `prefetch`: batches
  built ahead while the step runs (data.num_workers = 0); `sources`: the run's data (default: opened from data_cfg)."""
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} outside [0, {process_count})')
  sources = sources or prepared.open_data(data_cfg, seq_len, model_vocab_size)
  ds, stores = train_batches(
    data_cfg, sources, batch_size_per_host * process_count, seq_len, seed, process_index, process_count
  )
  if data_cfg.num_workers > 0:
    from absl import flags  # pylint: disable=g-import-not-at-top

    if not flags.FLAGS.is_parsed():  # mp_prefetch reads absl flags; a trainer without absl.app has not parsed them
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=data_cfg.num_workers, per_worker_buffer_size=data_cfg.worker_buffer_size)
    )
  else:  # the next batches are built while the step runs
    ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
  it = iter(ds)
  it.stores = stores  # each source's fetch counters (bytes downloaded, peak disk) for the log and the benchmark
  return it


def train_batches(
  data_cfg: ml_collections.ConfigDict,
  sources: prepared.Sources,
  global_batch: int,
  seq_len: int,
  seed: int,
  process_index: int,
  process_count: int,
) -> tuple[host_batches.TrainBatches, dict[str, store_lib.Store]]:
  """(this process's batches of the run's sources, each source's store), all checked before a shard is read."""
  mix = sources.mix
  if data_cfg.num_workers > 0 and not mix.plain:
    raise errors.ConfigError(
      'data.num_workers > 0 builds whole batches per worker, and a mixture draws a varying number of rows from '
      'each source every step; set data.num_workers=0 with data.mixture'
    )
  fresh = [n.strip() for n in data_cfg.mixture_fresh.split(',') if n.strip()]
  unknown = sorted(set(fresh) - set(mix.names))
  if unknown:
    raise errors.ConfigError(
      f'data.mixture_fresh names {unknown[0]!r}, not a source of {mix.where} ({list(mix.names)})'
    )
  # data.virtual_shards, or its automatic value when it is 0 (the trainer resolves it once and records it).
  count = data_cfg.virtual_shards or data_config.auto_virtual_shards(global_batch, process_count)
  try:
    blocks = sources.block_docs(data_cfg.block_docs, data_cfg.mixture_block_docs, count)  # recorded at start
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  shares = {n: 1.0 for n in mix.names} if mix.plain else {n: min(s, 0.999) for n, s in mix.peak_shares().items()}
  seed = _data_seed(data_cfg, seed)
  rows = global_batch // count
  streams, stores = {}, {}
  for name, (directory, manifest) in sources.opened.items():
    one = data_config.source_config(data_cfg, directory, len(mix.sources), blocks[name])
    streams[name], stores[name] = _source(
      one, directory, manifest, global_batch, seq_len, seed, count, process_index, process_count, shares[name]
    )
  return host_batches.TrainBatches(streams, mix, seed, rows, sources.records(count), blocks, fresh), stores


def _source(
  data_cfg: ml_collections.ConfigDict,
  directory: str,
  manifest: shards.Manifest,
  global_batch: int,
  seq_len: int,
  seed: int,
  count: int,
  process_index: int,
  process_count: int,
  share: float,
) -> tuple[host_batches.HostBatches, store_lib.Store]:
  """(this process's row streams of one source, the store it reads through) over `count` virtual shards: its own
  packing, masking and position. `share`: the source's largest share of the rows: its downloads run that share of
  a window ahead of its reader, and below 1 none starts before its reader needs its first block."""
  listed = prepared.split_shards(directory, manifest, 'train')
  counts, files = [s['records'] for s in listed], [s['file'] for s in listed]
  virtual.check_layout(count, process_count, global_batch, sum(counts))
  if data_cfg.num_workers > 0 and paths.is_url(directory):
    raise errors.ConfigError(
      'data.num_workers > 0 reads local data only (each worker would keep its own bucket cache); '
      'set data.num_workers=0 for data.dir on a bucket'
    )
  bounds = virtual.ranges(counts, count)
  owned = {
    v: virtual.ShardStream(
      virtual.pieces(counts, *bounds[v]), seed=seed, shard=v, window=data_cfg.shuffle_window, shuffle=True
    )
    for v in virtual.owned(count, process_index, process_count)
  }
  # Only this process's files are checked and (from a bucket) fetched.
  mine = [listed[f] for f in sorted({p.file for st in owned.values() for p in st.parts})]
  store = prepared.open_store(directory, manifest, 'train', mine, data_cfg.cache_gb, process_index)
  # A budget too small is one line at start, not an eviction loop mid-run (nothing to size for data read in place).
  if store.caches and (need := cache_need(list(owned.values()), listed, data_cfg.block_docs)) > store.budget:
    raise errors.ConfigError(
      f"data.cache_gb={data_cfg.cache_gb:.6g} is too small for this process's {len(owned)} virtual shard(s): "
      f'the windows one block of data.block_docs={data_cfg.block_docs} documents touches, and the next, need '
      f'{need / 2**30:.6g} GiB; raise data.cache_gb, or lower data.shuffle_window or data.block_docs'
    )
  # A source of a mixture reads ahead by its share of the rows, so its bytes follow its weight (docs/data.md,
  # "Several sources"). A plain data.dir's owned shards start downloading their first windows now, side by side,
  # not one after the other as each reads its first block (a restored iterator's are then evicted as needed).
  if share >= 1:
    store.prefetch([files[f] for st in owned.values() for f in st.files_of_window(st.first_window())])
  built = {
    v: virtual.ShardBlocks(st, store, files, data_cfg.block_docs, manifest.id_dtype, ahead=share).map_with_index(
      BlockBuilder.for_source(data_cfg, manifest, seq_len, seed, v)
    )
    for v, st in owned.items()
  }
  return host_batches.HostBatches(built, global_batch // count), store


def make_eval_iterator(
  data_cfg: ml_collections.ConfigDict,
  batch_size_per_host: int,
  seq_len: int,
  seed: int = 0,
  process_index: int = 0,
  process_count: int = 1,
  *,
  num_batches: int | None = None,
  model_vocab_size: int | None = None,
):
  """Batches of this process's contiguous 1/n of the held-out split, same masking every call: one pass, the last
  batch topped up with loss-free rows, or num_batches (the share cycles), which multi-host runs must pass."""
  if num_batches is None and process_count > 1:
    raise ValueError('multi-host eval needs num_batches so every host runs the same steps')
  directory, manifest = prepared.open_prepared(data_cfg, seq_len, model_vocab_size)
  listed = prepared.split_shards(directory, manifest, 'eval')
  counts = [s['records'] for s in listed]
  lo, hi = virtual.ranges(counts, process_count)[process_index]
  if hi <= lo:
    raise errors.DataError(f'{directory}: the eval split ({sum(counts)} records) cannot feed {process_count} processes')
  stream = virtual.ShardStream(virtual.pieces(counts, lo, hi), seed=0, shard=0, window=1, shuffle=False)
  mine = [listed[f] for f in sorted({p.file for p in stream.parts})]
  store = prepared.open_store(directory, manifest, 'eval', mine, data_cfg.cache_gb, process_index)
  blocks = virtual.ShardBlocks(
    stream, store, [s['file'] for s in listed], data_cfg.block_docs, manifest.id_dtype, finite=True
  )
  if num_batches is not None:
    blocks = blocks.repeat()
  seed = _data_seed(data_cfg, seed)
  blocks = blocks.map_with_index(BlockBuilder.for_source(data_cfg, manifest, seq_len, seed, 0))
  # Built and checked once; every iteration is a fresh pass with the same masking.
  batches = host_batches.HostBatches({0: blocks}, batch_size_per_host)
  return batches if num_batches is None else grain.experimental.LimitIterDataset(batches, num_batches)


class BlockBuilder:
  """grain map_with_index: block index + (tokens, lengths) -> packed, masked rows (dicts of [rows, T] arrays)."""

  def __init__(self, seq_len: int, seed: int, shard: int, pack: dict, mask: dict):
    self.seq_len, self.seed, self.shard, self.pack, self.mask = seq_len, seed, shard, pack, mask

  @classmethod
  def for_source(
    cls, data_cfg: ml_collections.ConfigDict, manifest: shards.Manifest, seq_len: int, seed: int, shard: int
  ) -> 'BlockBuilder':
    """The builder of virtual shard `shard` of the prepared data `manifest` describes."""
    special = manifest.special_ids
    pack = {'mode': data_cfg.packing, 'pad_id': special['pad'], 'max_docs': data_cfg.max_documents_per_row}
    mask = {
      'rate': data_cfg.mask_rate,
      'strategy': data_cfg.mask_strategy,
      'mask_id': special['mask'],
      'is_special': masking.special_table(manifest.vocab_size, special.values()),
      'max_predictions': data_cfg.max_predictions,
    }
    return cls(seq_len, seed, shard, pack, mask)

  def __call__(self, index: int, block) -> dict:
    tokens, lengths = block
    rng = np.random.default_rng([self.seed, self.shard, index])
    rows = packing.pack_block(tokens, lengths, self.seq_len, rng=rng, **self.pack)
    rows.update(masking.mask_rows(rows['input_ids'], rows['segment_ids'], rng, **self.mask))
    return rows
