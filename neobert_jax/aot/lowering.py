"""Lowering the trainer's real step for a compile-only target mesh: 'train' (the full jitted step) or
'forward_backward' (one micro-batch's loss and gradients, to isolate the model). Runs in the AOT child only."""

from __future__ import annotations

from neobert_jax.aot import targets


def lower_step(cfg, target: targets.Target, what: str = 'train'):
  """Lower `what` for the target mesh; returns (lowered, mesh). Raises ConfigError if the trainer would refuse."""
  import jax
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P

  from neobert_jax import sharding as shd
  from neobert_jax.config import train as train_config
  from neobert_jax.train import mlm

  devices = targets.devices(target)
  # The trainer's own checks (unknown keys, batch divisibility over the mesh and over the target's hosts), so
  # a recipe that compiles here is one the trainer accepts there.
  train_config.validate_train(cfg, num_devices=len(devices), process_count=len({d.process_index for d in devices}))
  try:
    mesh = shd.make_mesh(cfg.mesh, devices)
  except ValueError as e:  # dcn sizes that do not match the target's slices / hosts: the config's to fix
    raise train_config.ConfigError(f'mesh: {e}') from None
  defs, abstract_state = mlm.abstract_train_state(cfg, mesh)
  batch = mlm.abstract_batch(cfg, mesh)
  if what == 'train':
    return mlm.jit_mlm_train_step(cfg, mesh, defs).lower(abstract_state, batch), mesh
  if what != 'forward_backward':
    raise ValueError(f'unknown program {what!r}')
  packed = cfg.data.packing == 'packed'
  limit = mlm.max_segments(cfg.data)
  micro = {
    k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype, sharding=NamedSharding(mesh, P(*v.sharding.spec[1:])))
    for k, v in batch.items()
  }

  def loss_and_grads(params, micro):
    def loss(p):
      total, (count, _) = mlm.mlm_sums(nnx.merge(defs.model_def, p), micro, packed, limit)
      return total / jax.numpy.maximum(count, 1.0)

    return jax.value_and_grad(loss)(params)

  fn = jax.jit(
    loss_and_grads,
    in_shardings=(defs.shardings['params'], {k: v.sharding for k, v in micro.items()}),
    out_shardings=(NamedSharding(mesh, P()), defs.shardings['params']),
  )
  with shd.activate(mesh):
    return fn.lower(abstract_state['params'], micro), mesh
