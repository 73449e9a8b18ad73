"""The one jitted train step: summed loss -> token-weighted gradients -> optimizer update, non-finite rollback.
Micro-batch sums are divided by the total count at the end (not by A), so accumulation is exact; each 'data'
replica scans its own rows under a shard_map and one psum follows, so the gradient crosses the DCN once per step."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax import sharding as shd
from neobert_jax.engine.state import StateDefs, TrainState

# (model, one micro-batch, dropout key or None) -> (summed loss, count it is averaged over, {name: other sum})
LossSums = Callable[[Any, dict, Any], tuple[jax.Array, jax.Array, dict[str, jax.Array]]]


def micro_batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """[A, M, ...] arrays: the micro-batch axis is replicated, rows are split over the rules' 'batch' axes."""
  return NamedSharding(mesh, P(None, shd.logical_to_spec(('batch',))[0]))


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How a task's step differs: accumulation, non-finite skipping, weight name, batch metrics, EMA decay."""

  micro_batched: bool
  skip_nonfinite: bool
  weight_name: str | None = None
  batch_metrics: Callable[[dict], dict] | None = None
  ema_decay: float = 0.0


def train_step_fn(defs: StateDefs, loss_sums: LossSums, options: StepOptions) -> Callable:
  """The un-jitted step (state, batch, key) -> (new_state, metrics); an 'ema' follows in float32."""
  ema_decay = options.ema_decay
  param_shardings = defs.shardings['params']
  # Batch axes holding whole copies of the weights ('data'): gradients are summed over them once per step.
  replicas = shd.replica_axes(param_shardings)
  mesh = jax.tree.leaves(param_shardings)[0].mesh if replicas else None

  def loss_fn(params: Any, micro: dict[str, jax.Array], key: Any):
    loss_sum, weight, sums = loss_sums(nnx.merge(defs.model_def, params), micro, key)
    return loss_sum, (weight, sums)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def accumulate(params: Any, batch: dict[str, jax.Array], key: Any):
    """Scans the A micro-batches, adding losses, counts and gradients; the sums of the rows this program sees."""

    def add_micro_batch(carry, xs):
      grads, loss_sum, weight, sums = carry
      index, micro = xs
      micro_key = None if key is None else jax.random.fold_in(key, index)
      (l, (w, s)), g = grad_fn(params, micro, micro_key)
      grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
      # Keep the accumulator laid out like the parameters so FSDP never materialises a full gradient.
      grads = jax.lax.with_sharding_constraint(grads, param_shardings)
      return (grads, loss_sum + l, weight + w, jax.tree.map(jnp.add, sums, s)), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    first = {k: v[0] for k, v in batch.items()}
    sum_zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: loss_fn(params, first, key)[1][1]))
    init = (jax.lax.with_sharding_constraint(zeros, param_shardings), 0.0, 0.0, sum_zeros)
    accum = jax.tree.leaves(batch)[0].shape[0]
    (grads, loss_sum, weight, sums), _ = jax.lax.scan(add_micro_batch, init, (jnp.arange(accum), batch))
    return (loss_sum, (weight, sums)), grads

  def accumulate_per_replica(params: Any, batch: dict[str, jax.Array], key: Any):
    """Each replica accumulates its own rows' gradients unreduced; one psum follows, once per step."""
    if key is not None:  # each replica draws its own dropout for its own rows
      key = jax.random.fold_in(key, jax.lax.axis_index(replicas))
    return jax.lax.psum(accumulate(params, batch, key), replicas)

  def gradients(params: Any, batch: dict[str, jax.Array], key: Any):
    if not options.micro_batched:
      return grad_fn(params, batch, key)
    if jax.tree.leaves(batch)[0].shape[0] == 1:
      # One micro-batch: no accumulator (saves a zero-fill and an add over every parameter per step).
      return grad_fn(params, {k: v[0] for k, v in batch.items()}, key)
    if not replicas:
      return accumulate(params, batch, key)
    # check_vma=False: the gradients taken inside stay each replica's own (no implicit psum per micro-batch).
    per_replica = jax.shard_map(
      accumulate_per_replica,
      mesh=mesh,
      in_specs=(P(), P(None, replicas), P()),
      out_specs=P(),
      axis_names=set(replicas),
      check_vma=False,
    )
    return per_replica(params, batch, key)

  def step(state: TrainState, batch: dict[str, jax.Array], key: Any = None) -> tuple[TrainState, dict]:
    # nnx.merge wraps the incoming arrays in Variables that opt.update then mutates in place, so the pre-update
    # values are captured as plain leaves now (needed to roll back a non-finite update).
    old_leaves = jax.tree.leaves(state)
    old_param_norm = optax.tree.norm(state['params'])
    params = state['params']
    (loss_sum, (weight, sums)), grads = gradients(params, batch, key)
    denom = jnp.maximum(weight, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    loss = loss_sum / denom
    grad_norm = optax.tree.norm(grads)

    model = nnx.merge(defs.model_def, params)
    opt = nnx.merge(defs.opt_def, state['opt'])
    lr = defs.schedule(opt.step[...])  # the rate this update uses (optax counts from the same step)
    opt.update(model, grads)
    new_state = {'params': nnx.state(model, nnx.Param), 'opt': nnx.state(opt)}
    if 'ema' in state:
      new_state['ema'] = jax.tree.map(
        lambda e, p: (ema_decay * e.astype(jnp.float32) + (1.0 - ema_decay) * p.astype(jnp.float32)).astype(e.dtype),
        state['ema'],
        new_state['params'],
      )

    param_norm = optax.tree.norm(new_state['params'])
    # The update itself can overflow even when loss and gradients were finite (a huge learning rate), so the
    # new parameters' norm is checked too: a state that is not finite is never committed or checkpointed.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(param_norm)
    if options.skip_nonfinite:
      new_leaves, treedef = jax.tree.flatten(new_state)
      new_state = jax.tree.unflatten(treedef, [jnp.where(finite, n, o) for n, o in zip(new_leaves, old_leaves)])
      param_norm = jnp.where(finite, param_norm, old_param_norm)
    metrics = {
      'loss': loss,
      **{k: v / denom for k, v in sums.items()},
      'grad_norm': grad_norm,
      'param_norm': param_norm,
      'learning_rate': lr,
      'finite': finite,
    }
    if options.weight_name:
      metrics[options.weight_name] = weight
    if options.batch_metrics is not None:
      metrics.update(options.batch_metrics(batch))
    return new_state, metrics

  return step


def jit_train_step(
  defs: StateDefs,
  mesh: jax.sharding.Mesh,
  loss_sums: LossSums,
  batch_shardings: dict[str, NamedSharding],
  options: StepOptions,
  *,
  uses_key: bool = False,
) -> shd.MeshBound:
  """The jitted step, state donated; step(state, batch) or, with uses_key, step(state, batch, key)."""
  replicated = NamedSharding(mesh, P())
  in_shardings = (defs.shardings, batch_shardings) + ((replicated,) if uses_key else ())
  fn = train_step_fn(defs, loss_sums, options)
  return shd.MeshBound(
    mesh, jax.jit(fn, in_shardings=in_shardings, out_shardings=(defs.shardings, replicated), donate_argnums=0)
  )
