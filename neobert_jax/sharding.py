"""Declarative sharding: parameters and activations name logical axes; one rules table maps them to mesh axes, so
changing parallelism is a change of mesh sizes, never of model code. Across slices or nodes the mesh is hybrid
(dcn_data / dcn_fsdp), with the same axes and rules."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, PartitionSpec

MESH_AXES = ('data', 'fsdp', 'tensor')

# Logical axis -> mesh axis (or axes). Weights shard their 'embed' dimension over fsdp (ZeRO-3 style) and their
# head / FFN / vocab dimension over tensor (Megatron style); activations shard the batch over data x fsdp.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
  ('batch', ('data', 'fsdp')),
  ('length', None),
  ('embed', 'fsdp'),
  ('act_embed', None),
  ('vocab', 'tensor'),
  ('heads', 'tensor'),
  ('mlp', 'tensor'),
  ('head_dim', None),
  ('layers', None),
  ('norm', None),
  ('predictions', None),
)


# The mesh axes that may span slices (TPU) or nodes (GPU), each with its config field. Tensor parallelism never
# does: its all-reduces sit inside every layer's forward and backward, too many and too small for the slow
# data-centre network (DCN) between slices, so tensor stays on the fast links (ICI / NVLink) inside one.
DCN_FIELDS = {'data': 'dcn_data', 'fsdp': 'dcn_fsdp'}


@dataclasses.dataclass(frozen=True)
class MeshLayout:
  """A resolved mesh: per axis, its size in one slice / node (ici) and how many it spans (dcn; varying slowest)."""

  ici: tuple[int, ...]
  dcn: tuple[int, ...]

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(i * d for i, d in zip(self.ici, self.dcn))

  @property
  def num_granules(self) -> int:
    """Slices (TPU) or nodes (GPU) the mesh spans."""
    return math.prod(self.dcn)


def _fill(shape: list[int], num_devices: int, where: str) -> list[int]:
  """Fills a single -1 entry so the product equals num_devices; raises a clear error otherwise."""
  named = dict(zip(MESH_AXES, shape))
  fill = [i for i, s in enumerate(shape) if s == -1]
  if len(fill) > 1:
    raise ValueError(f'mesh sizes {named}: at most one axis may be -1.')
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(f'mesh sizes {named} must be positive (or -1 for one axis).')
  known = math.prod(s for s in shape if s != -1)
  if fill:
    if num_devices % known:
      raise ValueError(
        f"mesh sizes {named}: {num_devices} devices{where} are not divisible by the fixed axes' product {known}."
      )
    shape[fill[0]] = num_devices // known
  if math.prod(shape) != num_devices:
    raise ValueError(
      f'mesh sizes {named} use {math.prod(shape)} devices but {num_devices} are available{where}; '
      'set one axis to -1 to fill the rest.'
    )
  return shape


def resolve_layout(sizes: Mapping[str, int], num_devices: int) -> MeshLayout:
  """Per-slice sizes (data / fsdp / tensor, one may be -1) and dcn_* sizes (default 1) -> a MeshLayout."""
  sizes = dict(sizes)
  if unknown := [a for a in MESH_AXES if a not in sizes]:
    raise ValueError(f'mesh config is missing axes {unknown}; give sizes for {MESH_AXES} (one may be -1).')
  if int(sizes.get('dcn_tensor', 1)) != 1:
    raise ValueError(
      'mesh.dcn_tensor: tensor parallelism stays inside a slice / node (its per-layer all-reduces '
      'would cross the data-centre network); span slices with mesh.dcn_data or mesh.dcn_fsdp.'
    )
  dcn = tuple(int(sizes.get(DCN_FIELDS.get(a, ''), 1)) for a in MESH_AXES)
  if any(d < 1 for d in dcn):
    raise ValueError(
      f'mesh {", ".join(f"{f}={sizes[f]}" for f in DCN_FIELDS.values() if f in sizes)}: '
      'the number of slices / nodes an axis spans must be >= 1 (no -1 fill across slices).'
    )
  granules = math.prod(dcn)
  if num_devices % granules:
    raise ValueError(f'{num_devices} devices do not split into dcn_data x dcn_fsdp = {granules} slices / nodes.')
  where = f' per slice / node ({granules} of them)' if granules > 1 else ''
  ici = _fill([int(sizes[a]) for a in MESH_AXES], num_devices // granules, where)
  return MeshLayout(tuple(ici), dcn)


def _hybrid_devices(layout: MeshLayout, devices: Sequence[jax.Device]) -> np.ndarray:
  """The device array of a mesh whose dcn axes run across slices / nodes and the rest inside each one."""
  n = layout.num_granules
  slices = {getattr(d, 'slice_index', 0) for d in devices}
  processes = sorted({d.process_index for d in devices})
  if devices[0].platform == 'tpu':  # libtpu says which slice each chip is in; a slice's hosts share its ICI
    if len(slices) != n:
      raise ValueError(f'the devices are {len(slices)} TPU slice(s) but dcn_data x dcn_fsdp = {n}')
    return mesh_utils.create_hybrid_device_mesh(layout.ici, layout.dcn, devices, allow_split_physical_axes=True)
  if len(processes) == n:  # GPU nodes, one process each (GPU devices carry no slice index of their own)
    return mesh_utils.create_hybrid_device_mesh(
      layout.ici, layout.dcn, devices, process_is_granule=True, allow_split_physical_axes=True
    )
  if len(processes) > 1 and len(processes) % n:
    raise ValueError(f'{len(processes)} processes do not split into dcn_data x dcn_fsdp = {n} nodes')
  # Several processes per node (one per GPU: launchers number them node by node), or one process simulating
  # slices (tests on fake CPU devices): consecutive processes, then consecutive device ids, form a granule.
  ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
  per = len(ordered) // n
  blocks = np.stack(
    [
      mesh_utils.create_device_mesh(layout.ici, ordered[g * per : (g + 1) * per], allow_split_physical_axes=True)
      for g in range(n)
    ]
  )
  # [granule, ici...] -> [dcn..., ici...] -> interleave so each axis is (dcn outer, ici inner), as jax's helper does
  k = len(MESH_AXES)
  blocks = blocks.reshape(layout.dcn + layout.ici).transpose([x for a in range(k) for x in (a, k + a)])
  return blocks.reshape(layout.shape)


def make_mesh(sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh in Auto mode; with dcn_data / dcn_fsdp > 1 only those axes cross slices, so
  FSDP's gathers and tensor parallelism run on the fast links."""
  devices = list(devices) if devices is not None else jax.devices()
  layout = resolve_layout(sizes, len(devices))
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  if layout.num_granules > 1:
    return Mesh(_hybrid_devices(layout, devices), MESH_AXES, axis_types=axis_types)
  slices = {getattr(d, 'slice_index', 0) for d in devices}
  if len(slices) > 1:  # jax.make_mesh refuses these too, less helpfully
    raise ValueError(
      f'the devices are {len(slices)} TPU slices: set mesh.dcn_data (or mesh.dcn_fsdp) to '
      f'{len(slices)} so the mesh knows which axis crosses the data-centre network'
    )
  return jax.make_mesh(layout.shape, MESH_AXES, axis_types=axis_types, devices=devices)


def granule_ids(mesh: Mesh, layout: MeshLayout | None = None) -> list[int]:
  """The slice / node of each device in the mesh's flattened order (the partition ids of programs compiled on it)."""
  devices = list(mesh.devices.flat)
  slices = [getattr(d, 'slice_index', 0) for d in devices]
  if len(set(slices)) > 1:
    return slices
  if layout is not None and layout.num_granules > 1:
    coords = np.unravel_index(np.arange(len(devices)), layout.shape)
    return np.ravel_multi_index([c // i for c, i in zip(coords, layout.ici)], layout.dcn).tolist()
  return [d.process_index for d in devices]


@contextlib.contextmanager
def activate(mesh: Mesh) -> Iterator[None]:
  """The context in which sharded parameters are created and the model traced."""
  with jax.set_mesh(mesh), nnx.logical_axis_rules(LOGICAL_AXIS_RULES):
    yield


def creation_scope():
  """Flax 0.12 shards annotated parameters as they are created, which needs a mesh; with none active (one CPU,
  conversion tools, tests) create them unsharded instead of failing."""
  return nnx.use_eager_sharding(False) if jax.sharding.get_abstract_mesh().empty else contextlib.nullcontext()


def _mesh_axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
  """A PartitionSpec entry as the tuple of mesh axes it names."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def logical_to_spec(names: Sequence[str | None]) -> PartitionSpec:
  """The PartitionSpec of logical names. Inside a shard_map that splits some mesh axes by hand (the gradient
  accumulation's replica axes, engine/step.py) those axes are left out: each shard there is already one slice of
  them, and only the automatic axes are still the compiler's to lay out."""
  table = dict(LOGICAL_AXIS_RULES)
  mesh = jax.sharding.get_abstract_mesh()
  manual = set() if mesh.empty else set(mesh.manual_axes)

  def entry(name: str | None) -> str | tuple[str, ...] | None:
    target = table.get(name) if name is not None else None
    if not manual:
      return target
    kept = tuple(a for a in _mesh_axes(target) if a not in manual)
    return kept[0] if len(kept) == 1 else (kept or None)

  return PartitionSpec(*(entry(n) for n in names))


def replica_axes(param_shardings: Any) -> tuple[str, ...]:
  """Batch axes of size > 1 that shard no parameter ('data', not 'fsdp'): each device there can sum its own
  gradients over the micro-batches, crossing the axis once per step (engine/step.py)."""
  shardings = jax.tree.leaves(param_shardings)
  if not shardings:
    return ()
  mesh = shardings[0].mesh
  used = {a for s in shardings for entry in s.spec for a in _mesh_axes(entry)}
  batch = _mesh_axes(dict(LOGICAL_AXIS_RULES)['batch'])
  return tuple(a for a in batch if a not in used and mesh.shape[a] > 1)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Pins an activation's sharding when traced under a mesh; a no-op on a single device or outside a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or not set(MESH_AXES) <= set(mesh.axis_names):
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(names))


def per_shard(fn: Any, args: Sequence[Any], in_names: Sequence[Sequence[str | None]], out_names: Sequence[str | None]):
  """fn on each device's block of args through shard_map, so a kernel that knows no sharding (splash, cuDNN) runs
  on local shapes, also inside the gradient accumulation's shard_map; with no mesh, fn(*args)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
    return fn(*args)
  in_specs = tuple(logical_to_spec(names) for names in in_names)
  mapped = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=logical_to_spec(out_names), check_vma=False)
  return mapped(*args)


def inference_mesh() -> Mesh:
  """Every device on the batch (fsdp) axis: what inference commands use unless told otherwise."""
  return make_mesh({'data': 1, 'fsdp': -1, 'tensor': 1})


class MeshBound:
  """A jitted function always traced with the mesh and logical-axis rules active: the model pins activation
  shardings at trace time, which tracing outside the context would silently drop."""

  def __init__(self, mesh: Mesh, jitted: Any):
    self.mesh, self.jitted = mesh, jitted

  def __call__(self, *args: Any) -> Any:
    with activate(self.mesh):
      return self.jitted(*args)

  def lower(self, *args: Any) -> Any:
    with activate(self.mesh):
      return self.jitted.lower(*args)
