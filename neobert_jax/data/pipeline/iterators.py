"""The Grain pipeline training consumes: this host's share of the prepared shards -> packed, masked batches.

  this host's virtual shards (virtual.py), each an endless shuffled stream of documents read through a shard store
  (store.py: in place, or fetched from a bucket into a bounded cache, a window ahead of the reader)
  -> blocks of `block_docs` documents per virtual shard -> pack + mask each block (numpy, whole arrays)
  -> every step, B/V rows from each of this host's virtual shards, in shard order -> optional mp_prefetch workers
  -> a background thread keeps the next batches ready

Of n processes, process p owns virtual shards [p*V/n, (p+1)*V/n) and builds only its own rows: B/n per step. The
rows of global step k (process 0's, then 1's, ...) are the same for every n that divides V, because each virtual
shard gives B/V rows to every step whoever owns it. The iterator state is, per owned virtual shard, the next block
and row (two integers): restoring is a seek (one block rebuilt per shard), not a replay, and the states of the
processes of any earlier run merge into one table from which every process of the new run takes its own shards.

Batches are numpy dicts per host, as in the batch contract (data/pipeline/batch.py): input_ids, positions,
segment_ids, labels [B, T] int32, and with max_predictions > 0 mlm_positions, mlm_labels [B, P] int32 and
mlm_weights [B, P] float32.
"""

import hashlib
import json
from typing import Any

import grain
import ml_collections
import numpy as np

from neobert_jax import errors, paths
from neobert_jax.config import data as data_config
from neobert_jax.data import shards
from neobert_jax.data import tokenizer as tokenizer_lib
from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import packing
from neobert_jax.data.pipeline import store as store_lib
from neobert_jax.data.pipeline import virtual

STREAM = virtual.STREAM


class BlockBuilder:
  """grain map_with_index: block index + (tokens, lengths) -> packed, masked rows.

  Randomness comes from (seed, virtual shard, block index) alone, so a block is the same whichever process or
  worker builds it and however often it is rebuilt after a restore.
  """

  def __init__(
    self,
    *,
    seq_len: int,
    packing_mode: str,
    seed: int,
    rate: float,
    strategy: str,
    max_predictions: int,
    special: dict,
    vocab_size: int,
    max_docs: int = 0,
    shard: int = 0,
  ):
    self.seq_len, self.packing_mode, self.seed, self.shard = seq_len, packing_mode, seed, shard
    self.max_docs = max_docs
    self.rate, self.strategy, self.max_predictions = rate, strategy, max_predictions
    self.pad_id, self.mask_id = special['pad'], special['mask']
    self.is_special = masking.special_table(vocab_size, special.values())

  def __call__(self, index: int, block) -> dict:
    tokens, lengths = block
    rng = np.random.default_rng([self.seed, self.shard, index])
    rows = packing.pack_block(
      tokens, lengths, self.seq_len, self.packing_mode, self.pad_id, rng, max_docs=self.max_docs
    )
    masked = masking.mask_rows(
      rows['input_ids'],
      rows['segment_ids'],
      rng,
      rate=self.rate,
      strategy=self.strategy,
      mask_id=self.mask_id,
      is_special=self.is_special,
      max_predictions=self.max_predictions,
    )
    rows.update(masked)
    return rows


class HostBatches(grain.IterDataset):
  """Every step, `rows_per_shard` rows from each of the given virtual shards' row streams, concatenated in order.

  `blocks` maps a virtual shard's number to its MapDataset of built blocks (dicts of [rows, T] arrays). A slice
  (set by mp_prefetch: worker w of W) makes each stream use blocks w, w + W, ... of its shard.
  """

  def __init__(self, blocks: dict[int, grain.MapDataset], rows_per_shard: int, finite_pad: bool = False):
    super().__init__(list(blocks.values()))
    self.blocks, self.rows_per_shard, self.finite_pad = blocks, rows_per_shard, finite_pad
    self.block_slice = (0, 1)

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    del sequential_slice
    self.block_slice = (sl.start or 0, sl.step or 1)

  def __iter__(self):
    return _HostBatchIterator(self)


class _HostBatchIterator(grain.DatasetIterator):
  """State: {'stream', 'shards': {virtual shard: [next block, next row in it]}} (block numbers before slicing)."""

  def __init__(self, ds: HostBatches):
    super().__init__()
    self._ds = ds
    self._pos = {v: [0, 0] for v in ds.blocks}  # per shard: sliced block counter, row in it
    self._cache: dict[int, tuple[int, dict | None]] = {}
    self._exhausted = False

  def _block(self, v: int, k: int) -> dict | None:
    cached = self._cache.get(v)
    if cached is not None and cached[0] == k:
      return cached[1]
    start, step = self._ds.block_slice
    index = start + k * step
    blocks = self._ds.blocks[v]
    block = blocks[index] if index < len(blocks) else None
    self._cache[v] = (k, block)  # one block per shard alive, plus the one being cut
    return block

  def _rows(self, v: int, need: int) -> list[dict]:
    parts, pos = [], self._pos[v]
    while need:
      block = self._block(v, pos[0])
      if block is None:
        break
      n = len(block['input_ids'])
      if pos[1] >= n:
        pos[0], pos[1] = pos[0] + 1, 0
        continue
      take = min(need, n - pos[1])
      parts.append({k: a[pos[1] : pos[1] + take] for k, a in block.items()})
      pos[1] += take
      need -= take
    return parts

  def __next__(self) -> dict:
    if self._exhausted:
      raise StopIteration
    parts = []
    for v in self._ds.blocks:
      got = self._rows(v, self._ds.rows_per_shard)
      short = self._ds.rows_per_shard - sum(len(p['input_ids']) for p in got)
      if short:  # finite data (the held-out split) ran out in this shard
        self._exhausted = True
        if not self._ds.finite_pad or not (got or parts):
          raise StopIteration
        got.append(_loss_free_rows((got or parts)[0], short))
      parts += got
    # Copies, so a batch does not keep its blocks alive.
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def get_state(self) -> dict[str, Any]:
    start, step = self._ds.block_slice
    return {'stream': STREAM, 'shards': {str(v): [start + p[0] * step, p[1]] for v, p in self._pos.items()}}

  def set_state(self, state: dict[str, Any]) -> None:
    if state.get('stream') != STREAM:
      raise ValueError(f'not a {STREAM} state: {json.dumps(state)[:80]}')
    saved = state['shards']
    missing = [v for v in self._pos if str(v) not in saved]
    if missing:
      raise ValueError(f'the state holds no position for virtual shard(s) {missing[:4]}')
    start, step = self._ds.block_slice
    for v in self._pos:
      block, row = saved[str(v)]
      if (block - start) % step:
        raise ValueError(f"block {block} of virtual shard {v} is not one of this worker's ({start} + k * {step})")
      self._pos[v] = [(block - start) // step, int(row)]
    self._cache.clear()
    self._exhausted = False


def _loss_free_rows(like: dict, n: int) -> dict:
  """Filler rows that keep shapes static: real tokens (no empty attention), no loss."""
  idx = np.arange(n) % len(like['input_ids'])
  rows = {k: v[idx].copy() for k, v in like.items()}
  rows['labels'][:] = masking.IGNORE
  if 'mlm_weights' in rows:
    rows['mlm_weights'][:] = 0.0
  return rows


def prepare_builtin(data_cfg: ml_collections.ConfigDict, seq_len: int) -> None:
  """The explicit preparation step of a run on the built-in corpus (data.dir empty): fetches and tokenizes it once
  per machine. Opening prepared data (below) never does; the train command calls this first."""
  if not data_cfg.dir:
    from neobert_jax.data.prepare import corpus  # pylint: disable=g-import-not-at-top

    corpus.default_prepared_dir(max_length=seq_len, tokenizer=data_cfg.tokenizer or tokenizer_lib.BUILTIN_BERT)


def open_prepared(
  data_cfg: ml_collections.ConfigDict, seq_len: int, model_vocab_size: int | None = None
) -> tuple[str, dict]:
  """Finds the prepared data and checks it fits this run; returns (its directory or bucket URL, manifest).

  Reads only the manifest: no shard is opened or downloaded here. The built-in corpus (data.dir empty) must have
  been prepared (prepare_builtin); otherwise the error names the command that prepares it.
  """
  data_config.validate_data_config(data_cfg)
  directory = data_cfg.dir
  if not directory:
    from neobert_jax.data.prepare import corpus  # pylint: disable=g-import-not-at-top

    directory = corpus.default_prepared_dir(
      max_length=seq_len, tokenizer=data_cfg.tokenizer or tokenizer_lib.BUILTIN_BERT, build=False
    )
  if paths.is_url(directory):
    url = paths.resolve(directory, 'data.dir')
    manifest = shards.parse_manifest(store_lib.read_bucket_manifest(url), str(url))
  else:
    manifest = shards.read_manifest(directory)
  ident = manifest['tokenizer']
  # The manifest's own spec (what a run records as its tokenizer) names that vocabulary by definition, and need not
  # be loadable here (a vocabulary learned on the machine that prepared the data).
  if data_cfg.tokenizer and data_cfg.tokenizer != ident['spec']:
    want = tokenizer_lib.load_tokenizer(data_cfg.tokenizer).identity()
    if not tokenizer_lib.same_vocabulary(want, ident):
      raise errors.DataError(
        f'{directory} was prepared with tokenizer {ident["spec"]!r} ({ident["kind"]}, '
        f'{ident["vocab_size"]} ids), not data.tokenizer={data_cfg.tokenizer!r} '
        f'({want["kind"]}, {want["vocab_size"]} ids); prepare it again with that tokenizer'
      )
  if model_vocab_size is not None and model_vocab_size != ident['vocab_size']:
    raise errors.DataError(
      f'{directory} uses a {ident["vocab_size"]}-id vocabulary ({ident["spec"]!r}) but the '
      f'model has vocab_size={model_vocab_size}; they must match'
    )
  return directory, manifest


def _split(directory: str, manifest: dict, split: str) -> list[dict]:
  info = manifest['splits'].get(split)
  if not info or not info['shards']:
    raise errors.DataError(f'{directory}: split {split!r} holds no documents')
  return info['shards']


def open_store(directory: str, manifest: dict, split: str, listed: list[dict], cache_gb: float, process_index: int):
  """The store this process reads `listed` shards of `split` through (store.py): in place, or a bucket's cache."""
  if paths.is_url(directory):
    version = hashlib.sha256(shards.manifest_text(manifest).encode()).hexdigest()[:12]
    budget = int(min(cache_gb, 2**40) * 2**30)
    return store_lib.BucketStore(paths.resolve(directory, 'data.dir'), listed, budget, process_index, version, split)
  return store_lib.LocalStore(directory, listed)


def split_files(data_cfg: ml_collections.ConfigDict, seq_len: int, split: str, max_files: int | None = None):
  """Local paths of the first `max_files` shards of a split (all by default), fetched if the data is on a bucket;
  for reports that read a split whole on one process."""
  directory, manifest = open_prepared(data_cfg, seq_len)
  listed = _split(directory, manifest, split)[:max_files]
  store = open_store(directory, manifest, split, listed, float('inf'), 0)
  store.acquire([s['file'] for s in listed])
  return [store.local_path(s['file']) for s in listed], manifest


def iter_split_files(data_cfg: ml_collections.ConfigDict, seq_len: int, split: str):
  """(manifest, the local paths of a split's shards in order), each fetched only when the reader reaches it if the
  data is on a bucket, and released after, so the cache budget holds; for a report that reads a split from its start
  on one process and may stop early."""
  directory, manifest = open_prepared(data_cfg, seq_len)
  listed = _split(directory, manifest, split)
  store = open_store(directory, manifest, split, listed, data_cfg.cache_gb, 0)  # reports run on process 0

  def files():
    for shard in listed:
      store.acquire([shard['file']])
      try:
        yield store.local_path(shard['file'])
      finally:
        store.release([shard['file']])

  return manifest, files()


def _seed(shuffle_seed: int, seed: int) -> int:
  """The data's seed: data.shuffle_seed, or the run's seed when it is negative."""
  return seed if shuffle_seed < 0 else shuffle_seed


def _builder(data_cfg: ml_collections.ConfigDict, manifest: dict, seq_len: int, seed: int, shard: int) -> BlockBuilder:
  ident = manifest['tokenizer']
  return BlockBuilder(
    seq_len=seq_len,
    packing_mode=data_cfg.packing,
    seed=seed,
    rate=data_cfg.mask_rate,
    strategy=data_cfg.mask_strategy,
    max_predictions=data_cfg.max_predictions,
    special=ident['special_ids'],
    vocab_size=ident['vocab_size'],
    max_docs=data_cfg.max_documents_per_row,
    shard=shard,
  )


def virtual_shards(data_cfg: ml_collections.ConfigDict, global_batch: int, process_count: int) -> int:
  """data.virtual_shards, or its automatic value when it is 0 (the trainer resolves it once and records it)."""
  return data_cfg.virtual_shards or virtual.auto_virtual_shards(global_batch, process_count)


def cache_need(streams: list, listed: list[dict], block_docs: int) -> int:
  """Bytes a process must be able to hold: per virtual shard, the windows one block can touch plus the next one."""
  need = 0
  for st in streams:
    sizes = [sum(listed[p.file]['bytes'] for p in w) for w in st.windows]
    records = min(sum(p.size for p in w) for w in st.windows)
    span = min(len(sizes), -(-block_docs // max(records, 1)) + 1) + 1
    need += sum(sorted(sizes, reverse=True)[:span])
  return need


def _check_cache(store, streams: list, listed: list[dict], data_cfg) -> None:
  if not store.remote:
    return
  need = cache_need(streams, listed, data_cfg.block_docs)
  if need > store.budget:
    raise errors.ConfigError(
      f"data.cache_gb={data_cfg.cache_gb:.6g} is too small for this process's {len(streams)} virtual shard(s): "
      f'the windows one block of data.block_docs={data_cfg.block_docs} documents touches, and the next, need '
      f'{need / 2**30:.6g} GiB; raise data.cache_gb, or lower data.shuffle_window or data.block_docs'
    )


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
) -> grain.DatasetIterator:
  """Endless iterator of this host's training batches; has get_state/set_state. `prefetch`: batches built ahead
  while the step runs (data.num_workers = 0).

  Process p of n owns virtual shards [p*V/n, (p+1)*V/n) and gets B/V rows of each per step (B = n *
  batch_size_per_host), so the rows of a step do not depend on n. Save the state with
  grain.checkpoint.CheckpointSave(it) next to the train state; restore it with CheckpointRestore, or set_state,
  into an iterator made with the same data config and global batch size (states of several processes merge with
  merge_states first).
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} outside [0, {process_count})')
  directory, manifest = open_prepared(data_cfg, seq_len, model_vocab_size)
  listed = _split(directory, manifest, 'train')
  global_batch = batch_size_per_host * process_count
  count = virtual_shards(data_cfg, global_batch, process_count)
  problem = virtual.check_layout(count, process_count, global_batch, sum(s['records'] for s in listed))
  if problem:
    raise errors.ConfigError(problem)
  if data_cfg.num_workers > 0 and paths.is_url(directory):
    raise errors.ConfigError(
      'data.num_workers > 0 reads local data only (each worker would keep its own bucket cache); '
      'set data.num_workers=0 for data.dir on a bucket'
    )
  seed = _seed(data_cfg.shuffle_seed, seed)
  counts = [s['records'] for s in listed]
  bounds = virtual.ranges(counts, count)
  mine = virtual.owned(count, process_index, process_count)
  streams = {
    v: virtual.ShardStream(
      virtual.pieces(counts, *bounds[v]), seed=seed, shard=v, window=data_cfg.shuffle_window, shuffle=True
    )
    for v in mine
  }
  used = sorted({p.file for st in streams.values() for p in st.parts})
  # Only this process's files are checked and (from a bucket) fetched.
  store = open_store(directory, manifest, 'train', [listed[f] for f in used], data_cfg.cache_gb, process_index)
  _check_cache(store, list(streams.values()), listed, data_cfg)
  names = [s['file'] for s in listed]
  # Every owned shard's first window starts downloading now, side by side, not one after the other as each shard
  # reads its first block (a restored iterator reads other windows first; these are then evicted as needed).
  store.prefetch([names[f] for st in streams.values() for f in st.files_of_window(st.first_window())])
  dtype = shards.id_dtype(manifest)
  blocks = {
    v: virtual.ShardBlocks(st, store, names, data_cfg.block_docs, dtype).map_with_index(
      _builder(data_cfg, manifest, seq_len, seed, v)
    )
    for v, st in streams.items()
  }
  ds = HostBatches(blocks, global_batch // count)
  if data_cfg.num_workers > 0:
    _mark_absl_flags_parsed()
    ds = ds.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=data_cfg.num_workers, per_worker_buffer_size=data_cfg.worker_buffer_size)
    )
  else:  # the next batches are built while the step runs
    ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
  it = iter(ds)
  it.store = store  # the fetch counters (bytes downloaded, peak disk) for the log and the benchmark
  return it


def state_at(block: int, row: int = 0, shards_: range | list[int] = range(1)) -> dict[str, Any]:
  """The train iterator state (data.num_workers = 0) with every virtual shard in `shards_` at `row` of its block
  `block`. A seek costs building one block per shard, whatever the number."""
  return {'stream': STREAM, 'shards': {str(v): [int(block), int(row)] for v in shards_}}


def is_global_state(state: Any) -> bool:
  """Whether a (JSON-decoded) iterator state holds virtual-shard positions (mergeable across process counts)."""
  return STREAM in json.dumps(state)


def merge_states(states: list[Any]) -> Any:
  """One state holding every virtual shard's position, from the states of all processes of a run (same layout:
  the first one's, with the 'shards' tables of all of them joined)."""
  first = states[0]
  if isinstance(first, dict):
    if first.get('stream') == STREAM:
      joined = {}
      for s in states:
        joined.update(s['shards'])
      return {**first, 'shards': joined}
    return {k: merge_states([s[k] for s in states]) if all(k in s for s in states) else v for k, v in first.items()}
  if isinstance(first, list) and all(isinstance(s, list) and len(s) == len(first) for s in states):
    return [merge_states([s[i] for s in states]) for i in range(len(first))]
  return first


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
  """Batches of the held-out split, same masking every call (fixed seed).

  Each process reads only its contiguous 1/n of the split (a sharded evaluation: nobody reads it whole).
  num_batches=None: one pass over this process's share; the last batch is topped up with loss-free rows. Every
  host must run the same number of eval steps, so multi-host runs pass num_batches (the share is then cycled).
  """
  if num_batches is None and process_count > 1:
    raise ValueError('multi-host eval needs num_batches so every host runs the same steps')
  directory, manifest = open_prepared(data_cfg, seq_len, model_vocab_size)
  listed = _split(directory, manifest, 'eval')
  counts = [s['records'] for s in listed]
  lo, hi = virtual.ranges(counts, process_count)[process_index]
  if hi <= lo:
    raise errors.DataError(f'{directory}: the eval split ({sum(counts)} records) cannot feed {process_count} processes')
  stream = virtual.ShardStream(virtual.pieces(counts, lo, hi), seed=0, shard=0, window=1, shuffle=False)
  used = sorted({p.file for p in stream.parts})
  store = open_store(directory, manifest, 'eval', [listed[f] for f in used], data_cfg.cache_gb, process_index)
  blocks = virtual.ShardBlocks(
    stream, store, [s['file'] for s in listed], data_cfg.block_docs, shards.id_dtype(manifest), finite=True
  )
  if num_batches is not None:
    blocks = blocks.repeat()
  blocks = blocks.map_with_index(_builder(data_cfg, manifest, seq_len, _seed(data_cfg.shuffle_seed, seed), 0))
  return EvalBatches(HostBatches({0: blocks}, batch_size_per_host, finite_pad=True), num_batches)


class EvalBatches:
  """The held-out batches, built and checked once; every iteration is a fresh pass with the same masking."""

  def __init__(self, dataset: grain.IterDataset, num_batches: int | None):
    self.dataset, self.num_batches = dataset, num_batches

  def __iter__(self):
    it = iter(self.dataset)
    if self.num_batches is None:
      return it
    return (next(it) for _ in range(self.num_batches))


def _mark_absl_flags_parsed() -> None:
  """mp_prefetch reads absl flags; a trainer without absl.app has not parsed them."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
