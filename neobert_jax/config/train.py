"""The pretraining config: the whole schema, every field with what it means and its default, and its validation.

`validate` rejects unknown keys (a typo is an error, not a silent no-op) and what the trainer cannot run on the
current devices, naming the field and the fix. `resolve` fills in the run-time choices and what the data decides,
once, for pretraining and the compile command alike."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import ml_collections

from neobert_jax import config as config_lib
from neobert_jax import paths
from neobert_jax import sharding as shd
from neobert_jax.config import ramp
from neobert_jax.config.data import LABELLED_TASKS, auto_virtual_shards, default_data_config, validate_data_config
from neobert_jax.config.model import Choice, default_model_config, resolve_numerics, validate_model_config
from neobert_jax.config import check_choices, check_ranges
from neobert_jax.config.optimizer import adamw_ranges, check_optimizer_choice, optimizer_choice, resolve_warmup
from neobert_jax.errors import ConfigError

NAN_POLICIES = ('stop', 'skip')
# model.dtype values the trainer runs: float16 would need loss scaling, which it does not do.
TRAIN_DTYPES = ('auto', 'float32', 'bfloat16')
# optimizer.schedule and optimizer.decay_shape values (engine/optimizer.py computes them).
SCHEDULES = ('cosine', 'wsd', 'linear', 'constant')
DECAY_SHAPES = ('linear', 'cosine', '1-sqrt')


def decay_window(o: ml_collections.ConfigDict, num_steps: int) -> tuple[int, int]:
  """(first, length) of the 'wsd' or 'linear' decay: the last of those updates (step num_steps - 1) reaches the
  floor; 'wsd' decays over round(wsd_decay_fraction x num_steps) updates (at least 1), 'linear' after warmup."""
  if o.schedule == 'linear':
    return o.warmup_steps, num_steps - o.warmup_steps
  length = max(round(o.wsd_decay_fraction * num_steps), 1)
  return num_steps - length, length


def get_config() -> ml_collections.ConfigDict:
  """The schema, at its defaults: every field the trainer reads, each with the type of its default."""
  cfg = ml_collections.ConfigDict()
  cfg.seed = 0  # parameter init and anything else random on the trainer side (the data has its own seed)
  # The job's identity for the workdir's lease (neobert_jax/lease.py): a restart that gives the same run_id takes
  # the lease back at once instead of waiting out its timeout. '' = the scheduler's (SLURM job id, JobSet name).
  cfg.run_id = ''

  # Model architecture and numerics (config/model.py documents each field); the trainer computes in model.dtype
  # 'auto' (bfloat16 on GPU/TPU, float32 on CPU; resolved at start-up, written to config.json), float32 or bfloat16.
  cfg.model = default_model_config()
  cfg.model.dtype = 'auto'

  # Data pipeline (config/data.py documents each field): corpus, tokenizer, sequence length, packing, masking.
  cfg.data = default_data_config()

  # Device mesh. data = pure data parallel (replicated params), fsdp = data parallel with params/optimizer
  # sharded, tensor = model parallel over heads / mlp / vocab: sizes INSIDE one TPU slice or GPU node, one may be
  # -1 (fill). dcn_data / dcn_fsdp: how many slices or nodes the axis spans over the data-centre network; prefer
  # dcn_data, as FSDP across slices gathers every layer's weights over it (docs/pods.md).
  cfg.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1, dcn_data=1, dcn_fsdp=1))

  cfg.train = ml_collections.ConfigDict(
    dict(
      num_steps=1_000_000,  # optimizer steps of the whole run (also sets the schedule length)
      global_batch_size=2048,  # sequences per optimizer step, summed over all processes
      grad_accum_steps=1,  # micro-batches per step; the global batch is split evenly across them
      # Batch-size warmup (config/ramp.py): over the first batch_warmup_tokens tokens (sequences x max_length) the
      # global batch doubles from batch_warmup_start sequences up to global_batch_size. 0 = off.
      batch_warmup_tokens=0,
      batch_warmup_start=0,  # sequences per step at step 0: divides global_batch_size, splits like a micro-batch
      nan_policy='stop',  # non-finite loss/grad: 'stop' (exit, name the last good checkpoint) or 'skip'
      # > 0: keep an exponential moving average of the parameters, ema <- d x ema + (1 - d) x params after every
      # update (sharded like them, checkpointed, evaluated as eval/ema/*, exported with export.use_ema); 0 = off
      ema_decay=0.0,
    )
  )

  # AdamW with linear warmup then a decay (engine/optimizer.py computes each schedule; docs/recipes.md draws them);
  # decoupled weight decay on all weights except norms and biases.
  cfg.optimizer = ml_collections.ConfigDict(
    dict(
      # 'cosine' (decay_fraction / decay_steps below), 'wsd' (warmup, the peak, then a decay over the last
      # wsd_decay_fraction of num_steps shaped by decay_shape), 'linear' (warmup, then linear decay over the rest of
      # the run) or 'constant' (warmup, then the peak). Every decay ends at final_lr_fraction x peak_lr.
      schedule='cosine',
      wsd_decay_fraction=0.1,  # 'wsd': the share of num_steps (its last updates) that decays; in (0, 1]
      decay_shape='1-sqrt',  # 'wsd': 'linear', 'cosine' or '1-sqrt' (1 - sqrt(progress), ModernBERT's)
      peak_lr=6e-4,
      b1=0.9,
      b2=0.95,
      eps=1e-8,
      weight_decay=0.1,
      decay_embeddings=True,  # the paper decays every weight matrix, the token embedding included
      embedding_lr=0.0,  # the token embedding's peak rate, on the same schedule as its side's; 0 = that side's rate
      decay_all_params=False,  # True: norm scales and biases decay too (the original trainer's AdamW over
      # model.parameters()); False: pulling RMSNorm gains towards 0 only fights the model
      clip_norm=1.0,  # global-norm clipping threshold; 0 disables
      clip_eps=0.0,  # clip by clip_norm / (norm + clip_eps): 1e-6 is torch's clip_grad_norm_ (the original)
      warmup_steps=2000,  # linear warmup_init_fraction * peak_lr -> peak_lr over this many steps
      # > 0: the warmup is this share of train.num_steps instead; validate writes the steps into warmup_steps. The
      # recipe keeps its shape when num_steps changes (Cramming's and Izsak et al.'s warmups are shares of the
      # budget). A warmup_steps > 0 given beside it wins, logged (config/optimizer.resolve_warmup).
      warmup_fraction=0.0,
      warmup_init_fraction=0.0,  # the original trainer starts at 1e-4 * peak (torch LinearLR(start_factor=1e-4))
      decay_fraction=0.9,  # 'cosine' reaches its floor after this fraction of num_steps, then stays there
      decay_steps=0,  # > 0: the original trainer's cosine instead: period decay_steps from the end of
      # warmup, cut at ABSOLUTE step decay_steps, then the floor (decay_fraction unused)
      final_lr_fraction=0.1,  # floor = final_lr_fraction * peak_lr
    )
  )
  # Which optimizer: AdamW (the fields above), or Muon on the weight matrices (config/optimizer.py's fields).
  cfg.optimizer.update(optimizer_choice())

  # Held-out evaluation (MLM loss and accuracy on the data's eval split).
  cfg.eval = ml_collections.ConfigDict(
    dict(
      every_steps=1000,  # 0 disables periodic evaluation
      num_batches=16,  # global batches per evaluation (fixed, deterministic subset)
      at_start=False,  # also evaluate before the first step (a baseline for the loss curve)
      # The share of held-out tokens masked for the held-out loss (and for the report's baselines); 0 = the
      # training rate, data.mask_rate. Lets a run train at one rate and be measured at another.
      mask_rate=0.0,
      # A linear probe of frozen pooled embeddings at every evaluation (train/probe.py), logged as
      # eval/probe/<task>/accuracy; '' = off (so is the probe when evaluation is, eval.every_steps=0). Tasks: data/labelled.py (fine_food: Amazon reviews, great vs other).
      probe_task='',
      probe_train_size=1000,  # examples of the task's train split the probe is fitted on (a fixed sample)
      probe_test_size=1000,  # examples of its test split it is scored on
      probe_max_length=128,  # tokens per example ([CLS] and [SEP] included), at most model.max_length
      # The end-of-run report's baselines (unigram, neighbour counts: train/baselines.py). 'auto' and 'on':
      # computed (cached per prepared data); 'off': never.
      baselines='auto',
    )
  )

  # Orbax checkpoints in WORKDIR/checkpoints. Re-running the same command resumes from the latest complete one.
  cfg.checkpoint = ml_collections.ConfigDict(
    dict(
      every_steps=1000,  # also saved at the end and on SIGTERM
      keep=3,  # most recent checkpoints kept
      async_save=True,  # write arrays in the background while training continues
    )
  )

  # Start a new stage or continued pretraining from other weights (docs/recipes.md). Ignored when the workdir
  # already has a checkpoint (resume wins). At most one of from_checkpoint and from_hf may be set. The new stage
  # may change the sequence length, RoPE theta, mask rate, schedule, batch size and data; by default it takes the
  # parameters only (fresh optimizer, schedule from step 0, data from its start).
  cfg.init = ml_collections.ConfigDict(
    dict(
      from_checkpoint='',  # a workdir or its checkpoints/ dir written by this trainer
      step=-1,  # which step of from_checkpoint; -1 = latest
      from_hf='',  # a Hugging Face NeoBERT directory (config.json + weights)
      # from_checkpoint only: carry AdamW's moments over (the schedule still starts at this run's step 0, so it
      # may warm up again), instead of starting them at zero
      keep_optimizer=False,
      # from_checkpoint only: continue that run's data stream at its next unseen row, instead of at the start of
      # this run's data; needs the same stream (data.dir, seeds, packing, blocks, model.max_length)
      continue_data=False,
    )
  )

  cfg.logging = ml_collections.ConfigDict(
    dict(
      log_every=10,  # steps between metric fetches (tensorboard, metrics.jsonl, progress bar)
      tensorboard=True,
      progress_bar=True,
      peak_flops_per_device=0.0,  # for MFU; 0 = look the device up in the table (CPU: measure a matmul)
      profile_start_step=-1,  # >= 0: write a jax.profiler trace of profile_num_steps steps from this one
      profile_num_steps=3,
      # Also log every metric to Weights & Biases (the wandb extra: pip install -e .[wandb]). A field left '' is
      # wandb's environment variable (WANDB_PROJECT, WANDB_MODE), else the default ('neobert-jax', 'online'); the
      # files go to WANDB_DIR, else WORKDIR/wandb. A resumed run logs on into the same wandb run.
      wandb=False,
      wandb_project='',
      wandb_mode='',  # 'online', 'offline' (the run kept on disk) or 'disabled'
      wandb_run_name='',  # '' = wandb's own name
      wandb_tags='',  # comma-separated, e.g. 'stage1,250m'
    )
  )

  # After training, export the final parameters as a Hugging Face NeoBERT directory ('' = do not export).
  # use_ema: export the moving average of the parameters (train.ema_decay > 0) instead of the parameters.
  cfg.export = ml_collections.ConfigDict(dict(hf_dir='', use_ema=False))
  return cfg


def _mesh_layout(cfg: ml_collections.ConfigDict, num_devices: int | None = None) -> shd.MeshLayout:
  n = jax.device_count() if num_devices is None else num_devices
  try:
    return shd.resolve_layout(dict(cfg.mesh), n)
  except ValueError as e:
    raise ConfigError(f'mesh: {e}') from None


def mesh_shape(cfg: ml_collections.ConfigDict, num_devices: int | None = None) -> dict[str, int]:
  """The mesh section with -1 filled in, as config.json records it: per-slice sizes, and the config's dcn_* sizes."""
  layout = _mesh_layout(cfg, num_devices)
  dcn = {f: layout.dcn[shd.MESH_AXES.index(a)] for a, f in shd.DCN_FIELDS.items() if f in cfg.mesh}
  return dict(zip(shd.MESH_AXES, layout.ici)) | dcn


def typed_train(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A fresh copy of `cfg` fitted to this schema (config_lib.typed): every field of the schema's type."""
  return config_lib.typed(cfg, get_config(), 'neobert_jax/config/train.py')


def validate_train(
  cfg: ml_collections.ConfigDict, num_devices: int | None = None, process_count: int | None = None
) -> ml_collections.ConfigDict:
  """`cfg` typed (typed_train); raises ConfigError for a config this trainer cannot run on the current devices."""
  cfg = typed_train(cfg)
  validate_model_config(cfg.model)
  validate_data_config(cfg.data)
  t, ev, log = cfg.train, cfg.eval, cfg.logging
  if cfg.model.dtype not in TRAIN_DTYPES:
    raise ConfigError(
      f'model.dtype={cfg.model.dtype!r}; the trainer runs {TRAIN_DTYPES} (float16 would need loss '
      'scaling: use bfloat16)'
    )
  check_choices('train', t, (('nan_policy', NAN_POLICIES),))
  probe = (('probe_task', LABELLED_TASKS),) if ev.probe_task else ()
  check_choices('eval', ev, (('baselines', ('auto', 'on', 'off')), *probe))
  ranges = {
    'train': [
      *((f, t[f] >= 1, '>= 1') for f in ('num_steps', 'global_batch_size', 'grad_accum_steps')),
      ('ema_decay', 0 <= t.ema_decay < 1, 'in [0, 1) (0: no moving average; 0.999 is typical)'),
    ],
    'checkpoint': [(f, cfg.checkpoint[f] >= 1, '>= 1') for f in ('keep', 'every_steps')],
    'eval': [
      ('every_steps', ev.every_steps >= 0, '>= 0 (0 disables evaluation)'),
      ('num_batches', ev.num_batches >= 1, '>= 1'),
      ('mask_rate', 0.0 <= ev.mask_rate < 1.0, 'in [0, 1) (0: the training rate, data.mask_rate)'),
    ],
    'logging': [
      ('log_every', log.log_every >= 1, '>= 1'),
      ('peak_flops_per_device', log.peak_flops_per_device >= 0, '>= 0 (0: look it up)'),
    ],
  }
  for section, table in ranges.items():
    check_ranges(section, cfg[section], table)
  if ev.probe_task and (ev.probe_train_size < 2 or ev.probe_test_size < 1 or ev.probe_max_length < 3):
    raise ConfigError(
      'eval.probe_train_size must be >= 2, eval.probe_test_size >= 1 and eval.probe_max_length >= 3 '
      f'(got {ev.probe_train_size}, {ev.probe_test_size}, {ev.probe_max_length})'
    )
  resolve_warmup(cfg.optimizer, t.num_steps)
  _validate_optimizer(cfg.optimizer, t.num_steps)
  if cfg.export.use_ema and t.ema_decay == 0:
    raise ConfigError('export.use_ema=True exports the moving average of the weights: set train.ema_decay > 0')
  if cfg.data.max_predictions > cfg.model.max_length:
    raise ConfigError(
      f'data.max_predictions={cfg.data.max_predictions} exceeds the sequence length '
      f'model.max_length={cfg.model.max_length}'
    )
  if cfg.init.from_checkpoint and cfg.init.from_hf:
    raise ConfigError('set at most one of init.from_checkpoint and init.from_hf')
  carried = [f for f in ('keep_optimizer', 'continue_data') if cfg.init[f]]
  if carried and not cfg.init.from_checkpoint:
    raise ConfigError(
      f'init.{carried[0]}=True carries state over from another run of this trainer: set init.from_checkpoint to '
      f'its workdir, or set init.{carried[0]}=False'
    )

  layout = _mesh_layout(cfg, num_devices)
  shape = dict(zip(shd.MESH_AXES, layout.shape))  # totals: what the batch is split over
  nproc = jax.process_count() if process_count is None else process_count
  if layout.num_granules > 1 and nproc > 1 and nproc % layout.num_granules:
    raise ConfigError(
      f'mesh.dcn_data x mesh.dcn_fsdp = {layout.num_granules} slices / nodes, but the {nproc} '
      'processes do not split evenly over them (each slice or node runs whole processes)'
    )
  gb, accum = t.global_batch_size, t.grad_accum_steps
  if gb % accum:
    raise ConfigError(f'train.global_batch_size={gb} is not divisible by train.grad_accum_steps={accum}')
  micro = gb // accum
  shards = shape['data'] * shape['fsdp']
  if micro % shards:
    raise ConfigError(
      f'the micro-batch of {micro} rows (global_batch_size {gb} / grad_accum_steps {accum}) does not split '
      f"over the mesh's batch axes data x fsdp = {shape['data']} x {shape['fsdp']} = {shards}; make it a "
      f'multiple of {shards}'
    )
  if micro % nproc:
    raise ConfigError(f'the micro-batch of {micro} rows does not split over {nproc} processes')
  if problem := ramp.validate_ramp(cfg, shards, nproc):
    raise ConfigError(problem)
  return cfg


@dataclasses.dataclass(frozen=True)
class DataFacts:
  """What the run's data says about its config, as the data layer found it (config/ opens nothing)."""

  mixture: str = ''  # the mixture's sources and weights as recorded (Mixture.record; '' for a plain data.dir)
  tokenizer: str = ''  # the spec the data was prepared with; '' while the data is not open
  # (virtual shards, data.mixture_block_docs given or recorded) -> it resolved (a mixture's; ValueError if bad)
  block_docs: Callable[[int, str], str] | None = None


def resolve_train(
  cfg: ml_collections.ConfigDict,
  data: DataFacts | None = None,
  recorded: Mapping[str, Any] | None = None,
  *,
  process_count: int | None = None,
  platform: str | None = None,
  compute_capability: str | None = None,
  num_devices: int | None = None,
) -> tuple[ml_collections.ConfigDict, Choice]:
  """(a copy of the validated `cfg` resolved, as config.json records it; the attention choice): the one place a
  resolved field is set, for the trainer and the compile command alike. Each data field comes from the config, else
  `recorded` (a resumed run's), else the data."""
  if platform is None:
    platform = jax.default_backend()
    compute_capability = getattr(jax.devices()[0], 'compute_capability', None) if platform == 'gpu' else None
  out = ml_collections.ConfigDict(cfg.to_dict())
  out.mesh = ml_collections.ConfigDict(mesh_shape(cfg, num_devices))
  choice = resolve_numerics(
    out.model, platform=platform, packed=cfg.data.packing == 'packed', compute_capability=compute_capability
  )
  if data is None:
    return out, choice
  d, recorded = out.data, recorded or {}
  d.mixture_sources = data.mixture
  if not data.tokenizer:
    return out, choice
  d.tokenizer = d.tokenizer or str(recorded.get('tokenizer', '')) or data.tokenizer
  auto = auto_virtual_shards(ramp.read_rows(out), jax.process_count() if process_count is None else process_count)
  d.virtual_shards = d.virtual_shards or int(recorded.get('virtual_shards', 0)) or auto
  try:
    given = d.mixture_block_docs or str(recorded.get('mixture_block_docs', ''))
    d.mixture_block_docs = data.block_docs(d.virtual_shards, given) if data.block_docs else d.mixture_block_docs
  except ValueError as e:
    raise ConfigError(str(e)) from None
  return out, choice


def _validate_optimizer(o: ml_collections.ConfigDict, num_steps: int) -> None:
  """The optimizer values that cannot train: each refused with its field, its value and the range it needs."""
  ranges = (
    ('peak_lr', o.peak_lr > 0, '> 0'),
    ('embedding_lr', o.embedding_lr >= 0, ">= 0 (0: the rate of the embedding's side)"),
    *adamw_ranges(o),
    ('clip_eps', o.clip_eps >= 0, '>= 0'),
    ('warmup_steps', o.warmup_steps >= 0, '>= 0'),
    ('warmup_init_fraction', 0 <= o.warmup_init_fraction <= 1, 'in [0, 1]'),
    ('decay_fraction', 0 < o.decay_fraction <= 1, 'in (0, 1]'),
    ('decay_steps', o.decay_steps >= 0, '>= 0'),
    ('wsd_decay_fraction', 0 < o.wsd_decay_fraction <= 1, 'in (0, 1] (the share of train.num_steps that decays)'),
    (
      'final_lr_fraction',
      0 <= o.final_lr_fraction <= 1,
      'in [0, 1] (the floor is final_lr_fraction x peak_lr and may not exceed the peak)',
    ),
  )
  check_ranges('optimizer', o, ranges)
  check_optimizer_choice(o)
  check_choices('optimizer', o, (('schedule', SCHEDULES), ('decay_shape', DECAY_SHAPES)))
  if o.schedule == 'wsd':
    first, length = decay_window(o, num_steps)
    if first < o.warmup_steps:
      raise ConfigError(
        f'optimizer.schedule=wsd: warmup_steps={o.warmup_steps} overlaps the decay of the last {length} steps '
        f'(wsd_decay_fraction={o.wsd_decay_fraction} of train.num_steps={num_steps}); lower one of the two'
      )
  if o.warmup_steps > num_steps:
    raise ConfigError(
      f'optimizer.warmup_steps={o.warmup_steps} is longer than the run (train.num_steps={num_steps}): '
      'the learning rate would never reach its peak. Lower the warmup or raise num_steps.'
    )
  if o.schedule == 'cosine' and o.decay_steps > 0 and o.decay_steps <= o.warmup_steps:
    raise ConfigError(
      f'optimizer.decay_steps={o.decay_steps} is an absolute step and must exceed '
      f'optimizer.warmup_steps={o.warmup_steps} (the original trainer asserts the same)'
    )


def write_config(cfg: ml_collections.ConfigDict, workdir: str | Path) -> Path:
  """WORKDIR/config.json (process 0 writes; every process may call)."""
  path = paths.resolved(workdir, '--workdir') / 'config.json'
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text(path, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + '\n')
  return path


def eval_mask_rate(cfg: ml_collections.ConfigDict) -> float:
  """The share of held-out tokens masked by evaluation and assumed by the report's baselines."""
  return cfg.eval.mask_rate or cfg.data.mask_rate


def eval_data_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The data section the held-out batches are built with: the run's, masked at eval_mask_rate."""
  return config_lib.replace(cfg.data, {'mask_rate': eval_mask_rate(cfg)})


def describe_config(cfg: ml_collections.ConfigDict) -> str:
  """One line for the log: the run's shape at a glance."""
  m = cfg.model
  grows = ''
  if ramp.enabled(cfg):
    grows = ' after a ramp ' + ' -> '.join(f'{p.size}@step{p.first_step}' for p in ramp.phases(cfg))
  return (
    f'{m.num_layers}x{m.hidden_size} model, vocab {m.vocab_size}, seq {m.max_length}, '
    f'global batch {cfg.train.global_batch_size}{grows} ({cfg.train.grad_accum_steps} micro), '
    f'{cfg.train.global_batch_size * m.max_length:,} tokens/step, {cfg.train.num_steps:,} steps, mesh {dict(cfg.mesh)}, '
    f'compute {m.dtype}, attention {m.attention_impl}; {math.prod(dict(cfg.mesh).values())} devices'
  )
