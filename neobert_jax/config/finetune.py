"""The fine-tuning config schema (classification, regression, contrastive), its validation and `resolve`.

The `model` section only matters for a random initialisation: with `init.from_checkpoint` / `init.from_hf` the
architecture is the source's."""

from __future__ import annotations

import jax
import ml_collections

from neobert_jax import config as config_lib
from neobert_jax.config import check_choices, check_ranges
from neobert_jax.config.model import Choice, default_model_config, resolve_numerics, validate_model_config
from neobert_jax.config.optimizer import adamw_ranges, resolve_warmup
from neobert_jax.config.train import mesh_shape
from neobert_jax.errors import ConfigError

TASKS = ('classification', 'contrastive')
TASK_TYPES = ('auto', 'classification', 'regression')
SCHEDULES = ('linear', 'cosine')
POOLINGS = ('mean', 'cls')
REDUCTIONS = ('mean', 'sum')
FORMATS = ('auto', 'csv', 'tsv', 'jsonl', 'parquet')


def effective_lr(opt: ml_collections.ConfigDict, hidden_size: int) -> float:
  """The rate a fine-tuning run uses: optimizer.lr, scaled by optimizer.lr_width / hidden_size when lr_width > 0."""
  return opt.lr * opt.lr_width / hidden_size if opt.lr_width > 0 else opt.lr


def base_config(task: str = 'classification') -> ml_collections.ConfigDict:
  """Every field the fine-tuning job reads, with GLUE-style defaults (the paper's grid centre)."""
  cfg = ml_collections.ConfigDict()
  cfg.task = task  # 'classification' (also regression) or 'contrastive'
  cfg.seed = 0  # head init, dropout, shuffling, validation split
  cfg.run_id = ''  # the job's identity for the workdir's lease (neobert_jax/lease.py), as in pretraining
  cfg.model = default_model_config()  # used only without init.*; e.g. a tiny random model for tests
  cfg.model.dtype = 'auto'  # the numerics apply whatever the source (RUNTIME_FIELDS); 'auto' as in config/model.py
  cfg.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))  # same axes and rules as pretraining
  cfg.init = ml_collections.ConfigDict(
    dict(
      from_checkpoint='',  # a pretraining workdir (its latest or `step` checkpoint)
      step=-1,
      from_hf='',  # a Hugging Face NeoBERT directory
    )
  )
  cfg.data = ml_collections.ConfigDict(
    dict(
      train_file='',  # CSV / TSV / JSONL / Parquet (format from the suffix, or data.format)
      validation_file='',  # '' = hold out validation_fraction of the train file (stratified for labels)
      validation_fraction=0.1,
      format='auto',
      tokenizer='',  # '' = the source's tokenizer (pretraining run's data.tokenizer, HF dir), else bert
      max_length=128,  # tokens per example, [CLS]/[SEP] included; longer texts are truncated
      min_bucket=16,  # rows are padded to the next power of two >= this (few static shapes, few compiles)
      # classification / regression
      text_field='text',
      text_pair_field='',  # second text of a pair task ([CLS] a [SEP] b [SEP])
      label_field='label',
      task_type='auto',  # 'auto': non-integer numbers -> regression, anything else -> classification
      # contrastive
      query_field='query',
      positive_field='positive',
      negative_field='',  # optional hard negative column
      dataset_field='',  # optional column naming each row's dataset, for per-dataset instructions
      instructions='',  # JSON file {dataset: instruction}, prepended to queries ("Instruct: ...\nQuery: ")
      query_prefix='',  # a fixed prefix for every query (used when a row's dataset has no instruction)
      document_prefix='',  # a fixed prefix for every positive / negative
    )
  )
  cfg.train = ml_collections.ConfigDict(
    dict(
      epochs=3,
      num_steps=0,  # > 0 overrides epochs
      batch_size=32,  # global batch (rows) per optimizer step; must split over data x fsdp
      eval_every=0,  # steps between evaluations; 0 = once per epoch (and always at the end)
      eval_batch_size=64,
      log_every=10,
    )
  )
  cfg.optimizer = ml_collections.ConfigDict(
    dict(
      lr=2e-5,
      # > 0: `lr` is quoted for a model of this width (hidden size) and scaled by lr_width / model.hidden_size for
      # this one (Adam's rule for hidden layers in muP: the same relative change per step whatever the width), so
      # a paper's rate for its width carries over to a narrower model. 0: `lr` is used as given.
      lr_width=0,
      schedule='linear',
      warmup_fraction=0.1,  # the warmup as a share of the run's steps
      warmup_steps=0,  # > 0: the warmup in steps, which wins over warmup_fraction (logged)
      weight_decay=1e-2,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      clip_norm=1.0,
    )
  )
  cfg.head = ml_collections.ConfigDict(
    dict(
      dropout=0.1,  # NeoBERT's classifier dropout (before the dense layer and before the classifier)
      init_range=0.02,  # std of the head's normal init (NeoBERT's classifier_init_range)
      pooling='mean',  # contrastive / embeddings: masked mean (NeoBERT's MTEB pooling) or [CLS]
      # classification / regression: what the head reads, [CLS] (NeoBERT's head) or the masked mean of the
      # tokens (ModernBERT's classifier_pooling='mean'); the HF export's config.json carries it
      classifier_pooling='cls',
      normalize=True,  # contrastive export: L2-normalise embeddings
      temperature=0.07,  # InfoNCE temperature (NeoBERT's SupConLoss default)
      loss_reduction='mean',  # InfoNCE over the global batch: 'mean' or 'sum' (the original code sums)
    )
  )
  cfg.eval = ml_collections.ConfigDict(dict(metric=''))  # metric that picks the best step; '' = by task
  cfg.logging = ml_collections.ConfigDict(dict(tensorboard=True, progress_bar=True))
  # '' = no export; classification -> HF AutoModelForSequenceClassification dir, contrastive -> sentence-transformers
  cfg.export = ml_collections.ConfigDict(dict(dir=''))
  return cfg


def validate_finetune(cfg: ml_collections.ConfigDict, num_devices: int | None = None) -> ml_collections.ConfigDict:
  """`cfg` typed by the schema (config_lib.typed); raises ConfigError naming the field and the fix."""
  if cfg.get('task') not in TASKS:
    raise ConfigError(f'task={cfg.get("task")!r}; expected one of {TASKS}')
  cfg = config_lib.typed(cfg, base_config(cfg.task), 'neobert_jax/config/finetune.py')
  validate_model_config(cfg.model)
  d, t, o, h = cfg.data, cfg.train, cfg.optimizer, cfg.head
  if not d.train_file:
    raise ConfigError('data.train_file is empty; pass --config.data.train_file=PATH (CSV, TSV, JSONL or Parquet)')
  if cfg.init.from_checkpoint and cfg.init.from_hf:
    raise ConfigError('set at most one of init.from_checkpoint and init.from_hf')
  check_choices('data', d, (('format', FORMATS), ('task_type', TASK_TYPES)))
  check_choices('optimizer', o, (('schedule', SCHEDULES),))
  check_choices('head', h, (('pooling', POOLINGS), ('classifier_pooling', POOLINGS), ('loss_reduction', REDUCTIONS)))
  if t.epochs < 1 and t.num_steps < 1:
    raise ConfigError('set train.epochs >= 1 or train.num_steps >= 1')
  resolve_warmup(o, None)
  held_out = (
    ()
    if d.validation_file
    else (('validation_fraction', 0 < d.validation_fraction < 1, 'in (0, 1) when no data.validation_file is given'),)
  )
  ranges = {
    'data': [('max_length', d.max_length >= 4, '>= 4'), ('min_bucket', d.min_bucket >= 1, '>= 1'), *held_out],
    'optimizer': [('lr', o.lr > 0, '> 0'), ('lr_width', o.lr_width >= 0, '>= 0'), *adamw_ranges(o)],
    'head': [
      ('dropout', 0 <= h.dropout < 1, 'in [0, 1)'),
      ('temperature', h.temperature > 0, '> 0'),
      ('init_range', h.init_range > 0, '> 0'),
    ],
    'train': [('log_every', t.log_every >= 1, '>= 1'), ('eval_every', t.eval_every >= 0, '>= 0 (0: once per epoch)')],
  }
  for section, table in ranges.items():
    check_ranges(section, cfg[section], table)
  shape = mesh_shape(cfg, num_devices)
  shards = shape['data'] * shape['fsdp']
  for field in ('batch_size', 'eval_batch_size'):
    if t[field] < 1 or t[field] % shards:
      raise ConfigError(
        f'train.{field}={t[field]} does not split over the batch axes data x fsdp = {shards}; '
        f'make it a positive multiple of {shards}'
      )
  return cfg


# The model fields a fine-tuning run sets whatever the source: its numerics (the architecture is the source's).
RUNTIME_FIELDS = ('dtype', 'dots', 'attention_impl', 'scan_layers', 'remat_policy', 'param_dtype')


def resolve_finetune(
  cfg: ml_collections.ConfigDict,
  source_model: ml_collections.ConfigDict | None,
  tokenizer: str,
  *,
  platform: str | None = None,
  num_devices: int | None = None,
) -> tuple[ml_collections.FrozenConfigDict, Choice]:
  """(the validated `cfg` resolved once and frozen, as config.json records it; the attention choice with its reason):
  the source's architecture with this run's numerics, optimizer.lr the rate the run trains with (effective_lr)."""
  platform = platform or jax.default_backend()
  m = ml_collections.ConfigDict((source_model or cfg.model).to_dict())
  for field in RUNTIME_FIELDS:
    m[field] = cfg.model[field]
  choice = resolve_numerics(m, platform=platform, packed=False)  # fine-tuning pads its rows (downstream/batching.py)
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.model = m
  out.data.tokenizer = tokenizer
  out.optimizer.lr, out.optimizer.lr_width = effective_lr(cfg.optimizer, m.hidden_size), 0
  out.mesh = ml_collections.ConfigDict(mesh_shape(cfg, num_devices))
  return ml_collections.FrozenConfigDict(out), choice
