"""The training state: a plain dict pytree {'params', 'opt'[, 'ema']}, so jit, Orbax and donation see ordinary arrays
(the graph definitions travel in `StateDefs`), created inside jit under the mesh so no device gathers a parameter."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from neobert_jax import sharding as shd
from neobert_jax.weights.flat import path_key

TrainState = dict[str, Any]  # {'params': nnx.State, 'opt': nnx.State[, 'ema': nnx.State like params]}
ModelFactory = Callable[[], nnx.Module]


@dataclasses.dataclass(frozen=True)
class StateDefs:
  """Static pieces needed to rebuild the model and optimizer from a TrainState inside jit."""

  model_def: Any  # nnx.GraphDef of the model
  opt_def: Any  # nnx.GraphDef of nnx.Optimizer
  shardings: Any  # pytree of NamedSharding, same structure as the TrainState
  tx: optax.GradientTransformation
  schedule: optax.Schedule


def _optimizer(model: nnx.Module, tx: optax.GradientTransformation) -> nnx.Optimizer:
  """nnx.Optimizer over the model's Params; Muon's optax.MaskedNode placeholders are unwrapped from nnx's Param."""

  def init(params: Any) -> Any:
    hollow = lambda x: isinstance(x, nnx.Variable) and isinstance(x.get_value(), optax.MaskedNode)
    leaf = lambda x: isinstance(x, nnx.Variable)
    return jax.tree.map(lambda x: x.get_value() if hollow(x) else x, tx.init(params), is_leaf=leaf)

  return nnx.Optimizer(model, optax.GradientTransformation(init, tx.update), wrt=nnx.Param)


def _build(make_model: ModelFactory, tx: optax.GradientTransformation) -> tuple[nnx.Module, nnx.Optimizer]:
  model = make_model()
  return model, _optimizer(model, tx)


def _split(model: nnx.Module, opt: nnx.Optimizer) -> tuple[Any, Any, TrainState]:
  model_def, params, rest = nnx.split(model, nnx.Param, ...)
  if jax.tree.leaves(rest):
    # The contract says the model holds only Params; anything else would silently miss the checkpoint.
    raise ValueError(f'{type(model).__name__} holds non-Param state the engine does not checkpoint: {rest}')
  opt_def, opt_state = nnx.split(opt)
  return model_def, opt_def, {'params': params, 'opt': opt_state}


def abstract_state(
  make_model: ModelFactory,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  mesh: jax.sharding.Mesh,
  ema: bool = False,
) -> tuple[StateDefs, TrainState]:
  """Definitions and a TrainState of ShapeDtypeStructs with their target shardings (restore and AOT target)."""
  with shd.activate(mesh):
    model_def, opt_def, abstract = _split(*nnx.eval_shape(lambda: _build(make_model, tx)))
    # Only translates logical names while the rules are active; unannotated leaves (the step counter) replicate.
    shardings = nnx.get_named_sharding(abstract, mesh)
  if ema:
    abstract, shardings = {**abstract, 'ema': abstract['params']}, {**shardings, 'ema': shardings['params']}
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  return StateDefs(model_def, opt_def, shardings, tx, schedule), abstract


def create_state(
  make_model: ModelFactory,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  mesh: jax.sharding.Mesh,
  ema: bool = False,
) -> tuple[StateDefs, TrainState]:
  """Freshly initialised parameters and optimizer state, each array sharded at birth (an EMA starts as their copy)."""
  defs, _ = abstract_state(make_model, tx, schedule, mesh, ema)
  with shd.activate(mesh):
    # The out_shardings make the placement explicit even where the eager-sharding annotations would leave XLA a
    # choice (e.g. scalars), so the state matches what the train step's in_shardings expect exactly.
    shardings = {k: defs.shardings[k] for k in ('params', 'opt')}
    state = jax.jit(lambda: _split(*_build(make_model, tx))[2], out_shardings=shardings)()
  return defs, with_ema(defs, state)


def with_ema(defs: StateDefs, state: TrainState) -> TrainState:
  """`state` with its EMA, if the defs have one, restarted at a copy of its parameters (both are donated)."""
  if 'ema' not in defs.shardings:
    return state
  copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=defs.shardings['ema'])(state['params'])
  return {**state, 'ema': copy}


def with_params(defs: StateDefs, params: Any) -> TrainState:
  """A TrainState of the given parameters (loaded weights) and a fresh optimizer (and EMA, if any) around them."""
  with shd.activate(jax.tree.leaves(defs.shardings)[0].mesh):
    fresh_opt = lambda p: nnx.split(_optimizer(nnx.merge(defs.model_def, p), defs.tx))[1]
    params = jax.device_put(params, defs.shardings['params'])
    opt = jax.jit(fresh_opt, out_shardings=defs.shardings['opt'])(params)
  return with_ema(defs, {'params': params, 'opt': opt})


def restart_schedule(opt: Any) -> Any:
  """`opt` with every schedule counter zeroed; AdamW's moments and their count kept (init.keep_optimizer)."""
  leaves = jax.tree_util.tree_flatten_with_path(opt)[0]
  keys = [path_key(p) for p, _ in leaves]
  moments = {k.rsplit('.mu.', 1)[0] for k in keys if '.mu.' in k}

  def restarted(path: Any, leaf: Any) -> Any:
    key = path_key(path)
    owner = key.rsplit('.count', 1)[0] if '.count' in key else None
    if key.split('.')[0] == 'step' or (owner is not None and owner not in moments):
      return jnp.zeros_like(leaf)
    return leaf

  return jax.tree_util.tree_map_with_path(restarted, opt)


def param_count(state: TrainState) -> int:
  return int(sum(x.size for x in jax.tree.leaves(state['params'])))
