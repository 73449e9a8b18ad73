"""Declarative sharding: parameters and activations name logical axes; one rules table maps them to mesh axes.

Changing data / FSDP / tensor parallelism is a change of mesh sizes in the config, never of model code.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or axes). Weights shard their 'embed' dimension over fsdp (ZeRO-3 style) and their
# head / FFN / vocab dimension over tensor (Megatron style); activations shard the batch over data x fsdp.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("act_embed", None),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    ("predictions", None),
)


def resolve_mesh_shape(sizes: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """Fills a single -1 entry so the product equals num_devices; raises a clear error otherwise."""
  unknown = [a for a in MESH_AXES if a not in sizes]
  if unknown:
    raise ValueError(f"mesh config is missing axes {unknown}; give sizes for {MESH_AXES} (one may be -1).")
  shape = [int(sizes[a]) for a in MESH_AXES]
  fill = [i for i, s in enumerate(shape) if s == -1]
  if len(fill) > 1:
    raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, shape))}: at most one axis may be -1.")
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, shape))} must be positive (or -1 for one axis).")
  known = math.prod(s for s in shape if s != -1)
  if fill:
    if num_devices % known:
      raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, shape))}: {num_devices} devices are not divisible by "
                       f"the fixed axes' product {known}.")
    shape[fill[0]] = num_devices // known
  if math.prod(shape) != num_devices:
    raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, shape))} use {math.prod(shape)} devices but "
                     f"{num_devices} are available; set one axis to -1 to fill the rest.")
  return tuple(shape)


def make_mesh(sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh in Auto mode (GSPMD propagation, jit in/out shardings)."""
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape(sizes, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


@contextlib.contextmanager
def activate(mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> Iterator[None]:
  """The context in which sharded parameters are created and the model traced."""
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    yield


def creation_scope():
  """Flax 0.12 shards annotated parameters as they are created, which needs a mesh; with none active (one CPU,
  conversion tools, tests) create them unsharded instead of failing."""
  if jax.sharding.get_abstract_mesh().empty:
    return nnx.use_eager_sharding(False)
  return contextlib.nullcontext()


def logical_to_spec(names: Sequence[str | None], rules=LOGICAL_AXIS_RULES) -> PartitionSpec:
  table = dict(rules)
  return PartitionSpec(*(table.get(n) if n is not None else None for n in names))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Pins an activation's sharding when traced under a mesh; a no-op on a single device or outside a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or not set(MESH_AXES) <= set(mesh.axis_names):
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(names))
