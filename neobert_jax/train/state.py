"""The training state: parameters and optimizer state, created already sharded over the mesh.

The state is a plain dict pytree so that jit, Orbax and donation see ordinary arrays:
  {'params': nnx.State of the model's nnx.Param variables,
   'opt':    nnx.State of an nnx.Optimizer (step counter + optax state whose mu/nu mirror the params)}
The graph definitions (static structure) travel separately in `StateDefs`. Nothing here ever gathers a full
parameter on one device: creation runs inside jit under the mesh and the logical-axis rules, so every variable is
born with its final NamedSharding, and the abstract variant (for restore / AOT compile) allocates nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import optax
from flax import nnx

from neobert_jax import sharding as shd
from neobert_jax.model import NeoBERTForMLM
from neobert_jax.train.optimizer import make_optimizer

TrainState = dict[str, Any]  # {'params': nnx.State, 'opt': nnx.State}


@dataclasses.dataclass(frozen=True)
class StateDefs:
  """Static pieces needed to rebuild the model and optimizer from a TrainState inside jit."""
  model_def: Any          # nnx.GraphDef of NeoBERTForMLM
  opt_def: Any            # nnx.GraphDef of nnx.Optimizer
  shardings: Any          # pytree of NamedSharding, same structure as the TrainState
  tx: optax.GradientTransformation
  schedule: optax.Schedule


def _make(cfg: ml_collections.ConfigDict, tx: optax.GradientTransformation):
  model = NeoBERTForMLM(cfg.model, rngs=nnx.Rngs(int(cfg.seed)))
  return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def _split(model: Any, opt: Any) -> tuple[Any, Any, TrainState]:
  model_def, params, rest = nnx.split(model, nnx.Param, ...)
  if jax.tree.leaves(rest):
    # The contract says the model holds only Params; anything else would silently miss the checkpoint.
    raise ValueError(f'NeoBERTForMLM holds non-Param state the trainer does not checkpoint: {rest}')
  opt_def, opt_state = nnx.split(opt)
  return model_def, opt_def, {'params': params, 'opt': opt_state}


def _shardings(abstract: TrainState, mesh: jax.sharding.Mesh) -> Any:
  with nnx.logical_axis_rules(shd.LOGICAL_AXIS_RULES):
    # Only translates logical names while the rules are active; unannotated leaves (the step counter) replicate.
    return nnx.get_named_sharding(abstract, mesh)


def abstract_train_state(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> tuple[StateDefs, TrainState]:
  """Definitions and a TrainState of ShapeDtypeStructs carrying their target shardings; allocates nothing.

  Used as the Orbax restore target (restoring onto this mesh, whatever mesh wrote the checkpoint) and by
  neobert_jax/compile.py to lower the train step for other topologies.
  """
  tx, schedule = make_optimizer(cfg)
  with shd.activate(mesh):
    model, opt = nnx.eval_shape(lambda: _make(cfg, tx))
    model_def, opt_def, abstract = _split(model, opt)
  shardings = _shardings(abstract, mesh)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  return StateDefs(model_def, opt_def, shardings, tx, schedule), abstract


def create_train_state(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> tuple[StateDefs, TrainState]:
  """Freshly initialised parameters (seeded by cfg.seed) and optimizer state, each array sharded at birth."""
  defs, _ = abstract_train_state(cfg, mesh)

  with shd.activate(mesh):
    def create() -> TrainState:
      model, opt = _make(cfg, defs.tx)
      return _split(model, opt)[2]
    # The out_shardings make the placement explicit even where the eager-sharding annotations would leave XLA a
    # choice (e.g. scalars), so the state matches what the train step's in_shardings expect exactly.
    state = jax.jit(create, out_shardings=defs.shardings)()
  return defs, state


def with_params(defs: StateDefs, state: TrainState, params: Any) -> TrainState:
  """A TrainState whose parameters are replaced (e.g. loaded for stage 2), with a fresh optimizer around them."""
  with shd.activate(jax.tree.leaves(defs.shardings)[0].mesh):
    def fresh_opt(p: Any) -> Any:
      model = nnx.merge(defs.model_def, p)
      return nnx.split(nnx.Optimizer(model, defs.tx, wrt=nnx.Param))[1]
    params = jax.device_put(params, defs.shardings['params'])
    opt = jax.jit(fresh_opt, out_shardings=defs.shardings['opt'])(params)
  del state  # donated conceptually: the old arrays are no longer referenced by the caller's new state
  return {'params': params, 'opt': opt}


def param_count(state: TrainState) -> int:
  return int(sum(x.size for x in jax.tree.leaves(state['params'])))

