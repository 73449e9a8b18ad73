"""The jitted fine-tuning step: task loss -> gradients -> clipped AdamW update, state donated.

Shardings are explicit: the state keeps the shardings it was created with (pretraining's rules), every batch array
is split by rows over data x fsdp, the dropout key and the metrics are replicated. One step function serves every
task; the task supplies the loss.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax.downstream import batching
from neobert_jax.train.state import StateDefs, TrainState
from neobert_jax.train.step import MeshBound


def make_step(defs: StateDefs, loss: Callable[[Any, dict, jax.Array], tuple[jax.Array, jax.Array]]) -> Callable:
  """Un-jitted (state, batch, key) -> (new state, {'loss', 'grad_norm', 'learning_rate', 'finite'})."""

  def step(state: TrainState, batch: dict[str, jax.Array], key: jax.Array):
    def loss_fn(params):
      return loss(nnx.merge(defs.model_def, params), batch, key)

    (value, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
    model = nnx.merge(defs.model_def, state['params'])
    opt = nnx.merge(defs.opt_def, state['opt'])
    lr = defs.schedule(opt.step[...])
    opt.update(model, grads)
    grad_norm = optax.tree.norm(grads)
    metrics = {'loss': value, 'grad_norm': grad_norm, 'learning_rate': lr,
               'finite': jnp.isfinite(value) & jnp.isfinite(grad_norm)}
    return {'params': nnx.state(model, nnx.Param), 'opt': nnx.state(opt)}, metrics

  return step


def build_step(defs: StateDefs, loss: Callable, mesh: jax.sharding.Mesh, batch_keys: list[str]) -> Callable:
  data = batching.batch_sharding(mesh)
  replicated = NamedSharding(mesh, P())
  return MeshBound(mesh, jax.jit(make_step(defs, loss),
                                 in_shardings=(defs.shardings, {k: data for k in batch_keys}, replicated),
                                 out_shardings=(defs.shardings, replicated), donate_argnums=0))
