"""The jitted train and eval steps: MLM cross-entropy over masked tokens, token-weighted gradient accumulation.

A train batch arrives as a dict of global arrays shaped [A, M, ...]: A micro-batches of M rows each (A =
train.grad_accum_steps), with M sharded over the mesh's batch axes. The step scans over A, summing per-token loss
and gradients, and divides by the total number of masked tokens at the end. Dividing by the token count (not by A)
makes 4 micro-batches of 8 rows give exactly the gradient of one batch of 32, however the masked tokens happen
to fall, which a mean of per-micro-batch means would not.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax import sharding as shd
from neobert_jax.data import batch as batch_contract
from neobert_jax.model.attention import overflow
from neobert_jax.train.state import StateDefs, TrainState

def batch_keys(cfg: ml_collections.ConfigDict) -> tuple[str, ...]:
  """Keys the step reads (data/batch.py); anything else the data pipeline adds stays on the host."""
  return batch_contract.step_keys(int(cfg.data.max_predictions))


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """[A, M, ...] arrays: the micro-batch axis is replicated, rows are split over the rules' 'batch' axes."""
  return NamedSharding(mesh, P(None, shd.logical_to_spec(('batch',))[0]))


def abstract_batch(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                   accum: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """ShapeDtypeStructs of one global train batch (eval: accum=1, M = global batch / grad_accum_steps)."""
  a = int(cfg.train.grad_accum_steps) if accum is None else accum
  m = cfg.train.global_batch_size // cfg.train.grad_accum_steps
  s = batch_sharding(mesh)
  rows = batch_contract.row_shapes(int(cfg.model.max_length), int(cfg.data.max_predictions))
  return {k: jax.ShapeDtypeStruct((a, m) + shape, dtype, sharding=s) for k, (shape, dtype) in rows.items()}


def max_segments(cfg: ml_collections.ConfigDict) -> int | None:
  """The static documents-per-row bound of packed batches (None: unbounded), which cuDNN's packed layout needs."""
  limit = int(cfg.data.get('max_documents_per_row', 0))
  return limit if cfg.data.packing == 'packed' and limit > 0 else None


def mlm_sums(model: Any, micro: dict[str, jax.Array], packed: bool, max_segments: int | None = None
             ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Summed cross-entropy over the loss-carrying tokens of one micro-batch, plus (token count, correct count)."""
  seg = micro['segment_ids']
  masking = ({'segment_ids': seg, 'max_segments': max_segments} if packed
             else {'lengths': (seg > 0).sum(-1).astype(jnp.int32)})
  if 'mlm_positions' in micro:  # sparse head: decode only the (static number of) masked slots
    logits = model(micro['input_ids'], positions=micro['positions'], mlm_positions=micro['mlm_positions'], **masking)
    labels, weights = micro['mlm_labels'], micro['mlm_weights'].astype(jnp.float32)
  else:
    logits = model(micro['input_ids'], positions=micro['positions'], **masking)
    weights = (micro['labels'] >= 0).astype(jnp.float32)
    labels = jnp.maximum(micro['labels'], 0)  # -100 slots carry weight 0; any valid id keeps the gather in range
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return (ce * weights).sum(), (weights.sum(), (correct * weights).sum())


def _tree_norm(tree: Any) -> jax.Array:
  return optax.tree.norm(tree)


def make_train_step(cfg: ml_collections.ConfigDict, defs: StateDefs) -> Callable[[TrainState, dict], tuple]:
  """The un-jitted step function (state, batch) -> (new_state, metrics); see build_train_step."""
  packed = cfg.data.packing == 'packed'
  limit = max_segments(cfg)
  skip_nonfinite = cfg.train.nan_policy == 'skip'
  param_shardings = defs.shardings['params']

  def loss_fn(params: Any, micro: dict[str, jax.Array]):
    return mlm_sums(nnx.merge(defs.model_def, params), micro, packed, limit)

  def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    # nnx.merge wraps the incoming arrays in Variables that opt.update then mutates in place, so the pre-update
    # values are captured as plain leaves now (needed to roll back a non-finite update).
    old_leaves = jax.tree.leaves(state)
    old_param_norm = _tree_norm(state['params'])
    params = state['params']
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def accumulate(carry, micro):
      grads, loss_sum, count, correct = carry
      (l, (c, k)), g = grad_fn(params, micro)
      grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
      # Keep the accumulator laid out like the parameters so FSDP never materialises a full gradient.
      grads = jax.lax.with_sharding_constraint(grads, param_shardings)
      return (grads, loss_sum + l, count + c, correct + k), None

    if jax.tree.leaves(batch)[0].shape[0] == 1:
      # One micro-batch: no accumulator (saves a zero-fill and an add over every parameter per step).
      (loss_sum, (count, correct)), grads = grad_fn(params, {k: v[0] for k, v in batch.items()})
    else:
      zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
      init = (jax.lax.with_sharding_constraint(zeros, param_shardings), 0.0, 0.0, 0.0)
      (grads, loss_sum, count, correct), _ = jax.lax.scan(accumulate, init, batch)
    denom = jnp.maximum(count, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    loss = loss_sum / denom
    grad_norm = _tree_norm(grads)

    model = nnx.merge(defs.model_def, params)
    opt = nnx.merge(defs.opt_def, state['opt'])
    lr = defs.schedule(opt.step[...])  # the rate this update uses (optax counts from the same step)
    opt.update(model, grads)
    new_state = {'params': nnx.state(model, nnx.Param), 'opt': nnx.state(opt)}

    param_norm = _tree_norm(new_state['params'])
    # The update itself can overflow even when loss and gradients were finite (a huge learning rate), so the
    # new parameters' norm is checked too: a state that is not finite is never committed or checkpointed.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(param_norm)
    if skip_nonfinite:
      # Drop the whole update (params, moments and step counter).
      new_leaves, treedef = jax.tree.flatten(new_state)
      new_state = jax.tree.unflatten(treedef, [jnp.where(finite, n, o) for n, o in zip(new_leaves, old_leaves)])
      param_norm = jnp.where(finite, param_norm, old_param_norm)
    metrics = {'loss': loss, 'accuracy': correct / denom, 'grad_norm': grad_norm,
               'param_norm': param_norm, 'learning_rate': lr,
               'masked_tokens': count, 'finite': finite}
    if limit is not None:
      # Rows the static packed layout could not represent: the loop stops the run naming the setting.
      seg = batch['segment_ids']
      metrics['rows_over_document_limit'] = overflow(seg.reshape(-1, seg.shape[-1]), limit)
    return new_state, metrics

  return step


class MeshBound:
  """A jitted function that is always traced with the mesh and logical-axis rules active.

  The model pins activation shardings by logical name at trace time, so tracing outside the mesh context would
  silently drop them; binding the context here means callers (the loop, tests, AOT compile) cannot forget it.
  """

  def __init__(self, mesh: jax.sharding.Mesh, jitted: Any):
    self.mesh, self.jitted = mesh, jitted

  def __call__(self, *args: Any) -> Any:
    with shd.activate(self.mesh):
      return self.jitted(*args)

  def lower(self, *args: Any) -> Any:
    with shd.activate(self.mesh):
      return self.jitted.lower(*args)

  def trace(self, *args: Any) -> Any:
    with shd.activate(self.mesh):
      return self.jitted.trace(*args)


def build_train_step(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, defs: StateDefs) -> Callable:
  """The jitted train step with explicit in/out shardings and the state donated (updated in place).

  neobert_jax/compile.py can AOT-compile it: build_train_step(...).lower(abstract_state, abstract_batch(cfg, mesh)).
  """
  replicated = NamedSharding(mesh, P())
  data = batch_sharding(mesh)
  batch_shardings = {k: data for k in batch_keys(cfg)}
  return MeshBound(mesh, jax.jit(make_train_step(cfg, defs), in_shardings=(defs.shardings, batch_shardings),
                                 out_shardings=(defs.shardings, replicated), donate_argnums=0))


def build_eval_step(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, defs: StateDefs) -> Callable:
  """Jitted (params, batch[1, M, ...]) -> {'loss_sum', 'correct', 'count'} summed over the batch (no update)."""
  packed = cfg.data.packing == 'packed'
  limit = max_segments(cfg)
  data = batch_sharding(mesh)

  def evaluate(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    model = nnx.merge(defs.model_def, params)
    micro = {k: v[0] for k, v in batch.items()}
    loss_sum, (count, correct) = mlm_sums(model, micro, packed, limit)
    return {'loss_sum': loss_sum, 'correct': correct, 'count': count}

  return MeshBound(mesh, jax.jit(evaluate, in_shardings=(defs.shardings['params'], {k: data for k in batch_keys(cfg)}),
                                 out_shardings=NamedSharding(mesh, P())))
