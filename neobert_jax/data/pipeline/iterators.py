"""The Grain pipeline training consumes: prepared shards -> packed, masked batches.

  ArrayRecord source -> all documents, shuffled (reseeded every epoch) -> repeat
  -> blocks of `block_docs` documents -> pack + mask each block (numpy, whole
  arrays) -> cut rows into GLOBAL batches -> optional mp_prefetch workers
  -> this process's contiguous slice of each global batch

The global row stream does not depend on the process count: global batch k is
rows [k*B, (k+1)*B) of the stream, and process p of n owns rows
[k*B + p*B/n, k*B + (p+1)*B/n). Every process therefore walks the same stream
and its iterator state (block index + row, see _RowBatchIterator) is the same
on every process: a position in the global stream. Restoring it under another
process count is a seek, not a replay: rebuild the one block holding the row,
and each process keeps its own slice from there on. The price is that each
process packs and masks whole global batches (1/n of which it keeps); at
~12M tokens per CPU-second that is far below what a host's accelerators eat,
and only multi-host jobs pay it.

Blocks are random-access (block b is a pure function of seed and b), so the
iterator state is two integers plus Grain's own index. Batches are numpy dicts
per host, as in the batch contract (data/pipeline/batch.py): input_ids, positions,
segment_ids, labels [B, T] int32, and with max_predictions > 0 mlm_positions,
mlm_labels [B, P] int32 and mlm_weights [B, P] float32.
"""

import json
from typing import Any

import grain
import ml_collections
import numpy as np

from neobert_jax import errors, paths
from neobert_jax.data.pipeline import blocks as blocks_lib
from neobert_jax.config import data as config_lib
from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import packing
from neobert_jax.data import shards
from neobert_jax.data.pipeline import staging
from neobert_jax.data import tokenizer as tokenizer_lib


class BlockBuilder:
  """grain map_with_index: block index + (tokens, lengths) -> packed, masked rows.

  Randomness comes from (seed, block index) alone, so a block is the same
  whichever worker builds it and however often it is rebuilt after a restore.
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
  ):
    self.seq_len, self.packing_mode, self.seed = seq_len, packing_mode, seed
    self.max_docs = max_docs
    self.rate, self.strategy, self.max_predictions = rate, strategy, max_predictions
    self.pad_id, self.mask_id = special['pad'], special['mask']
    self.is_special = masking.special_table(vocab_size, special.values())

  def __call__(self, index: int, block) -> dict:
    tokens, lengths = block
    rng = np.random.default_rng([self.seed, index])
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


class RowBatchDataset(grain.IterDataset):
  """Cuts the parent's blocks of rows into batches of exactly `batch_size` rows."""

  def __init__(self, parent: grain.IterDataset, batch_size: int, finite_pad: bool = False):
    super().__init__(parent)
    self._batch_size = batch_size
    self._finite_pad = finite_pad

  def __iter__(self):
    return _RowBatchIterator(self._parent.__iter__(), self._batch_size, self._finite_pad)


# Marks an iterator state as a position in the process-count-independent global row stream (states written
# before that layout hold a per-process position and cannot be moved to another process count).
STREAM = 'global-rows/1'


class _RowBatchIterator(grain.DatasetIterator):
  """State: the parent's state *before* the block holding the next row, and that row."""

  def __init__(self, parent: grain.DatasetIterator, batch_size: int, finite_pad: bool):
    super().__init__(parent)
    self._batch_size = batch_size
    self._finite_pad = finite_pad
    self._block = None  # dict of [rows, T] arrays, or None before the first block
    self._block_state = parent.get_state()
    self._row = 0  # next row of self._block
    self._skip = 0  # rows to skip in the next block loaded (set by set_state)
    self._exhausted = False

  def _next_block(self) -> bool:
    self._block_state = self._parent.get_state()
    try:
      self._block = next(self._parent)
    except StopIteration:
      self._block = None
      return False
    self._row, self._skip = self._skip, 0
    return True

  def __next__(self) -> dict:
    if self._exhausted:
      raise StopIteration
    parts, need = [], self._batch_size
    while need:
      if self._block is None or self._row >= len(self._block['input_ids']):
        if not self._next_block():
          break
        continue
      take = min(need, len(self._block['input_ids']) - self._row)
      parts.append({k: v[self._row : self._row + take] for k, v in self._block.items()})
      self._row += take
      need -= take
    if need:  # finite data ran out
      self._exhausted = True
      if not parts or not self._finite_pad:
        raise StopIteration
      parts.append(_loss_free_rows(parts[0], need))
    # Copies, so a batch does not keep its whole block alive.
    return {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k].copy() for k in parts[0]}

  def get_state(self) -> dict[str, Any]:
    if self._block is None:
      return {'parent': self._block_state, 'row': self._skip, 'stream': STREAM}
    if self._row >= len(self._block['input_ids']):
      return {'parent': self._parent.get_state(), 'row': 0, 'stream': STREAM}
    return {'parent': self._block_state, 'row': self._row, 'stream': STREAM}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state['parent'])
    self._block_state = state['parent']
    self._block = None
    self._row = 0
    self._skip = int(state['row'])
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
  """Finds the prepared directory and checks it fits this run; returns (local dir, manifest). Reads only.

  Data on a bucket (data.dir=gs://...) is read from a verified local copy (staging.py): the returned directory is
  that copy, and the messages here name the URL. The built-in corpus (data.dir empty) must have been prepared
  (prepare_builtin); otherwise the error names the command that prepares it.
  """
  config_lib.validate_data_config(data_cfg)
  directory = shown = data_cfg.dir
  if not directory:
    from neobert_jax.data.prepare import corpus  # pylint: disable=g-import-not-at-top

    directory = shown = corpus.default_prepared_dir(
      max_length=seq_len, tokenizer=data_cfg.tokenizer or tokenizer_lib.BUILTIN_BERT, build=False
    )
  elif paths.is_url(directory):
    directory = staging.stage(paths.resolve(directory, 'data.dir'))
  manifest = shards.read_manifest(directory)
  ident = manifest['tokenizer']
  # The manifest's own spec (what a run records as its tokenizer) names that vocabulary by definition, and need not
  # be loadable here (a vocabulary learned on the machine that prepared the data).
  if data_cfg.tokenizer and data_cfg.tokenizer != ident['spec']:
    want = tokenizer_lib.load_tokenizer(data_cfg.tokenizer).identity()
    if not tokenizer_lib.same_vocabulary(want, ident):
      raise errors.DataError(
        f'{shown} was prepared with tokenizer {ident["spec"]!r} ({ident["kind"]}, '
        f'{ident["vocab_size"]} ids), not data.tokenizer={data_cfg.tokenizer!r} '
        f'({want["kind"]}, {want["vocab_size"]} ids); prepare it again with that tokenizer'
      )
  if model_vocab_size is not None and model_vocab_size != ident['vocab_size']:
    raise errors.DataError(
      f'{shown} uses a {ident["vocab_size"]}-id vocabulary ({ident["spec"]!r}) but the '
      f'model has vocab_size={model_vocab_size}; they must match'
    )
  return directory, manifest


def _seed(shuffle_seed: int, seed: int) -> int:
  """The data's seed: data.shuffle_seed, or the run's seed when it is negative."""
  return seed if shuffle_seed < 0 else shuffle_seed


def _builder(data_cfg: ml_collections.ConfigDict, manifest: dict, seq_len: int, seed: int) -> BlockBuilder:
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
  )


def _blocks(paths, data_cfg, seed, process_index, process_count, shuffle, id_dtype):
  source = grain.sources.ArrayRecordDataSource(paths)
  try:
    return blocks_lib.DocumentBlocks(
      source,
      data_cfg.block_docs,
      seed=seed,
      process_index=process_index,
      process_count=process_count,
      shuffle=shuffle,
      id_dtype=id_dtype,
    )
  except ValueError as e:
    raise errors.DataError(str(e)) from e


class _OwnRows:
  """Keeps this process's contiguous slice [start, start + size) of a global batch."""

  def __init__(self, start: int, size: int):
    self.start, self.size = start, size

  def __call__(self, batch: dict) -> dict:
    # Copies, so the host batch does not keep the whole global batch alive.
    return {k: v[self.start : self.start + self.size].copy() for k, v in batch.items()}


def make_train_iterator(
  data_cfg: ml_collections.ConfigDict,
  batch_size_per_host: int,
  seq_len: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  *,
  model_vocab_size: int | None = None,
) -> grain.DatasetIterator:
  """Endless iterator of this host's training batches; has get_state/set_state.

  Process p of n gets rows [p*b, (p+1)*b) (b = batch_size_per_host) of each
  global batch of n*b rows, so the rows of a step do not depend on n, and the
  state (a global position, equal on every process) restores under any n.
  Save it with grain.checkpoint.CheckpointSave(it) next to the train state;
  restore with CheckpointRestore, or set_state, into an iterator made with the
  same data config and global batch size.
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} outside [0, {process_count})')
  directory, manifest = open_prepared(data_cfg, seq_len, model_vocab_size)
  paths = shards.split_paths(directory, manifest, 'train')
  # The held-out shards are checked now too: a damaged one would otherwise stop the run at its first evaluation,
  # possibly hours in, instead of before the first step.
  if manifest['splits'].get('eval', {}).get('shards'):
    shards.split_paths(directory, manifest, 'eval')
  seed = _seed(data_cfg.shuffle_seed, seed)
  # The whole corpus, not a per-process share: the stream is the same for every process count.
  blocks = _blocks(paths, data_cfg, seed, 0, 1, shuffle=True, id_dtype=shards.id_dtype(manifest))
  blocks = blocks.map_with_index(_builder(data_cfg, manifest, seq_len, seed))
  # One thread builds the next block while the current one is cut into batches.
  ds = blocks.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))
  ds = RowBatchDataset(ds, batch_size_per_host * process_count)
  if data_cfg.num_workers > 0:
    _mark_absl_flags_parsed()
    ds = ds.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=data_cfg.num_workers, per_worker_buffer_size=data_cfg.worker_buffer_size)
    )
  if process_count > 1:
    ds = ds.map(_OwnRows(process_index * batch_size_per_host, batch_size_per_host))
  return iter(ds)


def state_at(block: int, row: int = 0) -> dict[str, Any]:
  """The train iterator state (data.num_workers = 0) standing at `row` of global block `block`.

  A seek costs building that one block, whatever its number: set_state(state_at(10**9)) is as fast as
  set_state(state_at(0)).
  """
  return {'parent': {'next_index': int(block)}, 'row': int(row), 'stream': STREAM}


def is_global_state(state: Any) -> bool:
  """Whether a (JSON-decoded) iterator state is a global-stream position, valid under any process count."""
  return STREAM in json.dumps(state)


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

  num_batches=None: one pass over this process's share; the last batch is
  topped up with loss-free rows. Every host must run the same number of eval
  steps, so multi-host runs pass num_batches (the split is then cycled).
  """
  if num_batches is None and process_count > 1:
    raise ValueError('multi-host eval needs num_batches so every host runs the same steps')
  directory, manifest = open_prepared(data_cfg, seq_len, model_vocab_size)
  paths = shards.split_paths(directory, manifest, 'eval')
  blocks = _blocks(paths, data_cfg, 0, process_index, process_count, shuffle=False, id_dtype=shards.id_dtype(manifest))
  if num_batches is not None:
    blocks = blocks.repeat()
  blocks = blocks.map_with_index(_builder(data_cfg, manifest, seq_len, _seed(data_cfg.shuffle_seed, seed)))
  it_ds = RowBatchDataset(
    blocks.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=1)),
    batch_size_per_host,
    finite_pad=True,
  )
  return EvalBatches(it_ds, num_batches)


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
