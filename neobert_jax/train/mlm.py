"""Pretraining as the engine sees it: the MLM model factory, where its parameters may start, its summed loss, its batch
shapes, host batches and steps. A train batch is [A, M, ...]: A micro-batches (train.grad_accum_steps) of M rows sharded
over the batch axes; engine/step.py accumulates over A, weighting by masked tokens. A start from another run or a
Hugging Face NeoBERT (weights/source.py) loads parameters only: the optimizer and schedule start afresh.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax import sharding as shd
from neobert_jax.config import ramp
from neobert_jax.config.data import mask_rate_at
from neobert_jax.data.pipeline import batch as batch_contract
from neobert_jax.data.pipeline import masking
from neobert_jax.engine import optimizer as optimizer_lib
from neobert_jax.engine import state as state_lib
from neobert_jax.engine import step as engine_step
from neobert_jax.engine.state import StateDefs, TrainState
from neobert_jax.model import NeoBERTForMLM
from neobert_jax.model.attention import overflow
from neobert_jax.model.sizes import train_flops_per_token
from neobert_jax.weights import source as source_lib


def model_factory(cfg: ml_collections.ConfigDict) -> Callable[[], NeoBERTForMLM]:
  return lambda: NeoBERTForMLM(cfg.model, rngs=nnx.Rngs(cfg.seed))


def flops_per_token(cfg: ml_collections.ConfigDict) -> float:
  """Model FLOPs per trained token of pretraining (the engine logs MFU with it): the sparse head decodes
  max_predictions of T slots."""
  seq, p = cfg.model.max_length, cfg.data.max_predictions
  decoder_fraction = min(p / seq, 1.0) if p > 0 else 1.0
  return train_flops_per_token(cfg.model, seq, decoder_fraction)


def init_source(cfg: ml_collections.ConfigDict) -> source_lib.Source | None:
  """The source of cfg.init (None: random init), checked against cfg.model before any model is built: a source
  that is missing or of another architecture is one line."""
  init = cfg.init
  # a run's exported weights, but its parameters when its optimizer state comes along (they belong together)
  src = source_lib.from_init(init.from_checkpoint, init.from_hf, init.step, raw=init.keep_optimizer)
  if src is not None:
    src.check_fits(cfg.model)
  return src


def abstract_train_state(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> tuple[StateDefs, TrainState]:
  """Definitions and a TrainState of ShapeDtypeStructs with their shardings (restore target, AOT compile)."""
  tx, schedule = optimizer_lib.make_optimizer(cfg.optimizer, cfg.train.num_steps)
  return state_lib.abstract_state(model_factory(cfg), tx, schedule, mesh, ema=cfg.train.ema_decay > 0)


def create_train_state(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> tuple[StateDefs, TrainState]:
  """Freshly initialised parameters (seeded by cfg.seed) and optimizer state, each array sharded at birth."""
  tx, schedule = optimizer_lib.make_optimizer(cfg.optimizer, cfg.train.num_steps)
  return state_lib.create_state(model_factory(cfg), tx, schedule, mesh, ema=cfg.train.ema_decay > 0)


def batch_keys(max_predictions: int) -> tuple[str, ...]:
  """Keys the step reads (data/pipeline/batch.py); anything else the data pipeline adds stays on the host."""
  return batch_contract.step_keys(max_predictions)


def abstract_batch(
  cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, accum: int | None = None, rows: int | None = None
) -> dict[str, jax.ShapeDtypeStruct]:
  """ShapeDtypeStructs of one global train batch of `rows` (default the global batch size) split into
  grad_accum_steps micro-batches (eval: accum=1, M = rows / grad_accum_steps)."""
  a = cfg.train.grad_accum_steps if accum is None else accum
  m = (rows or cfg.train.global_batch_size) // cfg.train.grad_accum_steps
  s = engine_step.micro_batch_sharding(mesh)
  rows = batch_contract.row_shapes(cfg.model.max_length, cfg.data.max_predictions)
  return {k: jax.ShapeDtypeStruct((a, m) + shape, dtype, sharding=s) for k, (shape, dtype) in rows.items()}


def stitch_micro_batches(
  batch: Mapping[str, np.ndarray], keys: tuple[str, ...], mesh: jax.sharding.Mesh, accum: int
) -> dict[str, jax.Array]:
  """[B_local, ...] host arrays -> {key: global [accum, B_global / accum, ...] array}. Each process gives its own
  rows (jax.make_array_from_process_local_data), so nothing is copied between hosts, and splitting them into
  micro-batches on the host keeps every device's slice of every micro-batch local."""
  sharding = engine_step.micro_batch_sharding(mesh)
  nproc = jax.process_count()
  out = {}
  for k in keys:
    if k not in batch:
      raise KeyError(f'the data pipeline gave no {k!r} (has {sorted(batch)}); check data.max_predictions')
    local = np.asarray(batch[k])
    if local.shape[0] % accum:
      raise ValueError(f'{local.shape[0]} local rows do not split into {accum} micro-batches')
    local = local.reshape((accum, local.shape[0] // accum) + local.shape[1:])
    global_shape = (accum, local.shape[1] * nproc) + local.shape[2:]
    out[k] = jax.make_array_from_process_local_data(sharding, local, global_shape)
  return out


class GlobalBatches:
  """Wraps a host iterator; yields (global arrays for the step, real tokens across all processes), from step
  `step` on (0 = the first update; a resumed run's step).

  A step of s rows concatenates s / ramp.read_rows host batches, in order (the batch-size warmup of
  config/ramp.py); under data.mask_rate_final it keeps that step's share of the masked tokens (masking.thin, drawn
  from (seed, step, process))."""

  def __init__(
    self, host_iter: Iterator[Mapping[str, np.ndarray]], cfg: ml_collections.ConfigDict, mesh: Any, step: int
  ):
    self.host_iter, self.cfg, self.mesh, self.step = host_iter, cfg, mesh, step
    self.keys = batch_keys(cfg.data.max_predictions)
    self.phases, self.unit = ramp.phases(cfg), ramp.read_rows(cfg)

  def __iter__(self) -> 'GlobalBatches':
    return self

  def next_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs of the batch __next__ gives next (its rows: the batch-size ramp's phase)."""
    return abstract_batch(self.cfg, self.mesh, rows=ramp.phase_at(self.phases, self.step).size)

  def _host_batch(self) -> Mapping[str, np.ndarray]:
    step, data = self.step, self.cfg.data
    n = ramp.phase_at(self.phases, step).size // self.unit
    self.step += 1
    parts = [next(self.host_iter) for _ in range(n)]
    batch = parts[0] if n == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if data.mask_rate_final <= 0:
      return batch
    keep = mask_rate_at(data, step, self.cfg.train.num_steps) / data.mask_rate
    return masking.thin(dict(batch), keep, np.random.default_rng([self.cfg.seed, step, jax.process_index()]))

  def __next__(self) -> tuple[dict[str, jax.Array], int]:
    batch = self._host_batch()
    # Processes read equal-sized shards of similar documents, so local * count estimates the global figure
    # without a cross-host reduction on the hot path.
    return stitch_micro_batches(batch, self.keys, self.mesh, self.cfg.train.grad_accum_steps), int(
      np.count_nonzero(batch['segment_ids'])
    ) * jax.process_count()


def max_segments(data_cfg: ml_collections.ConfigDict) -> int | None:
  """The static documents-per-row bound of packed batches (None: unbounded), which cuDNN's packed layout needs."""
  limit = data_cfg.get('max_documents_per_row', 0)
  return limit if data_cfg.packing == 'packed' and limit > 0 else None


def cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(optax.softmax_cross_entropy_with_integer_labels, whether the label is `jnp.argmax`'s pick), the same numbers.

  The label's logit is picked by a compare and a sum over the vocabulary instead of a gather: under tensor
  parallelism the vocabulary is split, and inside the per-replica gradient accumulation (engine/step.py, a
  shard_map manual over 'data') XLA's SPMD partitioner aborts on a gather along a split axis; the elementwise pick
  partitions like the logsumexp beside it. The hit is read off that logit too (the top value, and no earlier id as
  high: argmax's first-of-ties rule) rather than from an argmax, a variadic reduce that XLA:CPU runs slowly (the
  main job's step is 1.08x faster without it)."""
  vocab = jnp.arange(logits.shape[-1], dtype=labels.dtype)
  label_logits = jnp.where(vocab == labels[..., None], logits, 0.0).sum(-1)
  earlier_tie = jnp.any((vocab < labels[..., None]) & (logits >= label_logits[..., None]), -1)
  hit = (label_logits >= logits.max(-1)) & ~earlier_tie
  return jax.nn.logsumexp(logits, axis=-1) - label_logits, hit


def mlm_sums(
  model: Any, micro: dict[str, jax.Array], packed: bool, max_segments: int | None = None
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Summed cross-entropy over the loss-carrying tokens of one micro-batch, plus (token count, correct count)."""
  seg = micro['segment_ids']
  masking = (
    {'segment_ids': seg, 'max_segments': max_segments} if packed else {'lengths': (seg > 0).sum(-1).astype(jnp.int32)}
  )
  if 'mlm_positions' in micro:  # sparse head: decode only the (static number of) masked slots
    logits = model(micro['input_ids'], positions=micro['positions'], mlm_positions=micro['mlm_positions'], **masking)
    labels, weights = micro['mlm_labels'], micro['mlm_weights'].astype(jnp.float32)
  else:
    logits = model(micro['input_ids'], positions=micro['positions'], **masking)
    weights = (micro['labels'] >= 0).astype(jnp.float32)
    labels = jnp.maximum(micro['labels'], 0)  # -100 slots carry weight 0; any valid id keeps the gather in range
  ce, hit = cross_entropy(logits.astype(jnp.float32), labels)
  return (ce * weights).sum(), (weights.sum(), (hit * weights).sum())


def _loss_sums(cfg: ml_collections.ConfigDict) -> engine_step.LossSums:
  packed, limit = cfg.data.packing == 'packed', max_segments(cfg.data)

  def loss_sums(model: Any, micro: dict[str, jax.Array], key: Any):
    del key  # the pretrained model has no dropout
    loss_sum, (count, correct) = mlm_sums(model, micro, packed, limit)
    return loss_sum, count, {'accuracy': correct}

  return loss_sums


def _document_overflow(limit: int) -> Callable[[dict], dict]:
  def rows_over(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    # Rows the static packed layout could not represent: the loop stops the run naming the setting.
    seg = batch['segment_ids']
    return {'rows_over_document_limit': overflow(seg.reshape(-1, seg.shape[-1]), limit)}

  return rows_over


def _step_options(cfg: ml_collections.ConfigDict) -> engine_step.StepOptions:
  limit = max_segments(cfg.data)
  return engine_step.StepOptions(
    micro_batched=True,
    skip_nonfinite=cfg.train.nan_policy == 'skip',
    weight_name='masked_tokens',
    batch_metrics=None if limit is None else _document_overflow(limit),
    ema_decay=cfg.train.ema_decay,
  )


def jit_mlm_train_step(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, defs: StateDefs) -> shd.MeshBound:
  """The jitted (state, batch) -> (state, metrics) with the state donated; .lower() AOT-compiles it."""
  data = engine_step.micro_batch_sharding(mesh)
  return engine_step.jit_train_step(
    defs, mesh, _loss_sums(cfg), {k: data for k in batch_keys(cfg.data.max_predictions)}, _step_options(cfg)
  )


def jit_eval_step(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, defs: StateDefs) -> shd.MeshBound:
  """Jitted (params, batch[1, M, ...]) -> {'loss_sum', 'correct', 'count'} summed over the batch (no update)."""
  packed, limit = cfg.data.packing == 'packed', max_segments(cfg.data)
  data = engine_step.micro_batch_sharding(mesh)

  def evaluate(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    model = nnx.merge(defs.model_def, params)
    micro = {k: v[0] for k, v in batch.items()}
    loss_sum, (count, correct) = mlm_sums(model, micro, packed, limit)
    return {'loss_sum': loss_sum, 'correct': correct, 'count': count}

  keys = batch_keys(cfg.data.max_predictions)
  return shd.MeshBound(
    mesh,
    jax.jit(
      evaluate, in_shardings=(defs.shardings['params'], {k: data for k in keys}), out_shardings=NamedSharding(mesh, P())
    ),
  )
