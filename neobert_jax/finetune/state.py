"""Sharded fine-tuning state: a downstream model plus AdamW, born on the mesh with pretraining's logical rules.

The state is the trainer's plain {'params', 'opt'} dict and `StateDefs` (neobert_jax.train.state), so Orbax and
`with_params` work unchanged; only the model differs. Pretrained encoder weights are placed straight onto their
shardings by train/init.params_from_flat (each device receives only its shard).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from neobert_jax import sharding as shd
from neobert_jax.model.params import load_flat
from neobert_jax.train.init import params_from_flat
from neobert_jax.train.optimizer import weight_decay_mask
from neobert_jax.train.state import StateDefs, TrainState, with_params


def schedule(opt: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """Linear warmup over warmup_fraction of the steps, then linear or cosine decay to 0 at num_steps."""
  peak = float(opt.lr)
  warmup = int(round(float(opt.warmup_fraction) * num_steps))
  if opt.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(num_steps, warmup + 1), 0.0)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(warmup, 1)), optax.linear_schedule(peak, 0.0, max(num_steps - warmup, 1))],
      [max(warmup, 1)])


def make_optimizer(cfg: ml_collections.ConfigDict, num_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  o = cfg.optimizer
  lr = schedule(o, num_steps)
  # Norm scales and biases (the head's too) never decay, as in pretraining.
  adamw = optax.adamw(lr, b1=float(o.b1), b2=float(o.b2), eps=float(o.eps), weight_decay=float(o.weight_decay),
                      mask=weight_decay_mask(True))
  parts = [optax.clip_by_global_norm(float(o.clip_norm))] if o.clip_norm > 0 else []
  return optax.chain(*parts, adamw), lr


def _split(model: nnx.Module, opt: nnx.Optimizer) -> tuple[Any, Any, TrainState]:
  model_def, params, rest = nnx.split(model, nnx.Param, ...)
  if jax.tree.leaves(rest):
    raise ValueError(f'{type(model).__name__} holds non-Param state that would miss the checkpoint: {rest}')
  opt_def, opt_state = nnx.split(opt)
  return model_def, opt_def, {'params': params, 'opt': opt_state}


def create(make_model: Callable[[], nnx.Module], tx: optax.GradientTransformation, lr: optax.Schedule,
           mesh: jax.sharding.Mesh) -> tuple[StateDefs, TrainState]:
  """Freshly initialised, sharded state (every array created with its final NamedSharding, inside jit)."""
  def build():
    model = make_model()
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

  with shd.activate(mesh):
    model_def, opt_def, abstract = _split(*nnx.eval_shape(build))
    with nnx.logical_axis_rules(shd.LOGICAL_AXIS_RULES):
      shardings = nnx.get_named_sharding(abstract, mesh)
    state = jax.jit(lambda: _split(*build())[2], out_shardings=shardings)()
  return StateDefs(model_def, opt_def, shardings, tx, lr), state


def load_encoder(defs: StateDefs, state: TrainState, encoder_flat: dict[str, np.ndarray]) -> TrainState:
  """Replaces the encoder's parameters (the head keeps its fresh init) and restarts the optimizer around them."""
  params = jax.tree.map(lambda a: a, state['params'])
  params['encoder'] = params_from_flat(encoder_flat, state['params']['encoder'])
  return with_params(defs, state, params)


def host_params(state: TrainState) -> dict[str, np.ndarray]:
  """Flat {dotted key: numpy} copy of the parameters (for in-memory export and tests)."""
  return {'.'.join(str(getattr(p, 'key', p)) for p in path): np.asarray(jax.device_get(v[...]))
          for path, v in nnx.to_flat_state(state['params'])}


def model_from_flat(make_model: Callable[[], nnx.Module], flat: dict[str, np.ndarray]) -> nnx.Module:
  """A model holding `flat` on the default device (no mesh), without spending time on a random init."""
  graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
  model = nnx.merge(graphdef, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract))
  load_flat(model, flat)
  return model


def sharded_params(make_model: Callable[[], nnx.Module], flat: dict[str, np.ndarray], mesh: jax.sharding.Mesh
                   ) -> tuple[Any, Any, Any]:
  """(graphdef, params, shardings) for inference: `flat` placed onto the model's sharding under the mesh's rules,
  each device receiving only its shard (no optimizer, no random init)."""
  with shd.activate(mesh):
    graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
    shardings = nnx.get_named_sharding(abstract, mesh)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  return graphdef, params_from_flat(flat, abstract), shardings


def inference_mesh() -> jax.sharding.Mesh:
  """Every device on the batch (fsdp) axis: what inference commands use unless told otherwise."""
  return shd.make_mesh({'data': 1, 'fsdp': -1, 'tensor': 1})
