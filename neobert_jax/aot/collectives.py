"""Which collectives of a compiled program cross the data-centre network (DCN) between slices / nodes, and the
bytes each device sends over it per step.

GPU / CPU: a collective whose replica groups (mesh positions; `granule_of`) span slices or nodes. TPU multi-slice:
the compiler splits it into an in-slice collective and a `send` to the DCN runtime (`_xla_megascale_transfer_type`),
and those sends are the traffic. Bytes per device per execution, hierarchically (k granules, m members in each):
  all-gather      shard x (k - 1)             reduce-scatter  (S / m) x (k - 1) / k
  all-reduce      2 x (S / m) x (k - 1) / k   all-to-all      S x (k - 1) / k
  collective-permute  S                       for the pairs whose ends are in different slices
times how often its computation runs per step (loop trip counts)."""

import dataclasses
import math
import re
from typing import Callable, Iterable

import numpy as np

from neobert_jax import sharding as shd
from neobert_jax.aot import hlo as hlo_lib

KINDS = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all', 'collective-permute')


@dataclasses.dataclass
class Transfer:
  """One collective that crosses the DCN: dcn_bytes each device sends per run, per_step runs, over granules."""

  kind: str  # one of KINDS
  name: str  # the HLO instruction
  per_step: int
  granules: int
  dcn_bytes: float

  @property
  def bytes_per_step(self) -> float:
    return self.per_step * self.dcn_bytes


def _iota(reshape: str, perm: str | None) -> np.ndarray:
  """Device ids as XLA spells them: iota over the dims `reshape`, transposed by `perm` ([2,4]T(1,0))."""
  ids = np.arange(math.prod(_ints(reshape))).reshape(_ints(reshape))
  return ids.transpose(_ints(perm)) if perm else ids


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(',') if x.strip()]


def replica_groups(attrs: str, num_devices: int) -> list[list[int]] | None:
  """The groups of a collective's attributes, in any of XLA's spellings; None when it has none we can read."""
  m = re.search(
    r'replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))? \{([^}]*)\}', attrs
  )
  if m:  # mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}: groups vary along the named axes
    axes = re.findall(r"'(\w+)'=(\d+)", m.group(1))
    sizes = [int(s) for _, s in axes]
    ids = (_iota(m.group(2), m.group(3)) if m.group(2) else np.arange(math.prod(sizes))).reshape(sizes)
    names = [a for a, _ in axes]
    over = [names.index(a) for a in re.findall(r"'(\w+)'", m.group(4))]
    if not over:
      return None
    rest = [i for i in range(len(sizes)) if i not in over]
    return ids.transpose(rest + over).reshape(-1, math.prod(sizes[i] for i in over)).tolist()
  m = re.search(r'replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?', attrs)
  if m:  # iota form: [2,4]<=[8] or [4,2]<=[2,4]T(1,0)
    ids = _iota(m.group(3), m.group(4))
    return ids.reshape(int(m.group(1)), int(m.group(2))).tolist()
  m = re.search(r'replica_groups=\{((?:\{[\d,]*\},?)*)\}', attrs)
  if m:  # explicit {{0,1},{2,3}}; {} = every device in one group
    groups = [_ints(g) for g in re.findall(r'\{([\d,]*)\}', m.group(1))]
    return groups or [list(range(num_devices))]
  if m := re.search(r'source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}', attrs):
    return [_ints(p) for p in re.findall(r'\{(\d+,\d+)\}', m.group(1))]
  return None


_OP = re.compile(r'^(' + '|'.join(KINDS) + r')(-start|-done)?$')


def kind(op: str) -> tuple[str, str] | None:
  """(the collective, '' | '-start' | '-done') of an HLO op; None for any other op."""
  m = _OP.match(op)
  return m.groups('') if m else None


def result_bytes(ins: hlo_lib.Instr) -> float:
  """Bytes of a collective's result (an async start returns operands and results, except all-reduce)."""
  parts = hlo_lib.elements(ins.type)
  started = ins.op.endswith('-start') and ins.op != 'all-reduce-start' and len(parts) > 1
  return hlo_lib.nbytes(parts[1] if started else ins.type)


def ring_bytes(op: str, result: float, n: int) -> float:
  """Bytes one device sends over the link per execution of a ring algorithm among n devices."""
  return {
    'all-gather': result * (n - 1) / n,
    'reduce-scatter': result * (n - 1),
    'all-reduce': 2 * result * (n - 1) / n,
    'all-to-all': result * (n - 1) / n,
    'collective-permute': result,
  }[op]


def _hierarchical_bytes(op: str, data: float, k: int) -> float:
  """Bytes a device sends over the DCN when `data` is its part of the exchange between k slices (docstring)."""
  exchange = {'all-gather': data * (k - 1), 'all-reduce': 2 * data * (k - 1) / k, 'collective-permute': data}
  return exchange.get(op, data * (k - 1) / k)  # reduce-scatter, all-to-all


def dcn_transfers(
  mod: hlo_lib.Module, granule_of: Callable[[int], int], num_devices: int, num_granules: int
) -> list[Transfer]:
  """The DCN-crossing collectives of a compiled program (module docstring), in program order."""
  # A TPU multi-slice program numbers its in-slice collectives with slice-local ids; its DCN traffic is the sends.
  multislice = any('_xla_megascale_transfer_type' in i.attrs for body in mod.instrs.values() for i in body)
  out = []
  for comp, instrs in mod.instrs.items():
    for ins in instrs:
      mega = re.search(r'_xla_megascale_transfer_type="(\w+)"', ins.attrs)
      if mega and ins.op == 'send':
        op = mega.group(1).lower().replace('_', '-')
        payload = hlo_lib.nbytes(hlo_lib.elements(ins.type)[0])
        out.append(Transfer(op, ins.name, mod.runs[comp], num_granules, _hierarchical_bytes(op, payload, num_granules)))
        continue
      c = None if multislice else kind(ins.op)
      groups = replica_groups(ins.attrs, num_devices) if c and c[1] != '-done' else None
      if not groups:
        continue
      op = c[0]
      spans = [{granule_of(d) for d in g} for g in groups]
      k = max(len(s) for s in spans)
      if k < 2:
        continue
      result, g = result_bytes(ins), len(groups[0])
      data = {
        'all-gather': result / g,
        'reduce-scatter': result * k,
        'all-reduce': result * k / g,
        'all-to-all': result,
        'collective-permute': result * sum(len(s) > 1 for s in spans) / len(spans),  # the pairs that cross
      }[op]
      out.append(Transfer(op, ins.name, mod.runs[comp], k, _hierarchical_bytes(op, data, k)))
  return out


def by_kind(transfers: Iterable[Transfer]) -> dict[str, dict[str, float]]:
  """{kind: {'ops': distinct instructions, 'per_step': executions per step, 'bytes': bytes per step}}."""
  out: dict[str, dict[str, float]] = {}
  for t in transfers:
    row = out.setdefault(t.kind, {'ops': 0, 'per_step': 0, 'bytes': 0.0})
    row['ops'] += 1
    row['per_step'] += t.per_step
    row['bytes'] += t.bytes_per_step
  return dict(sorted(out.items(), key=lambda kv: -kv[1]['bytes']))


def for_mesh(hlo: str | hlo_lib.Module, mesh, layout=None) -> tuple[int, list[Transfer]]:
  """(slices / nodes the mesh spans, their DCN transfers) for a program (text, or parsed) compiled on `mesh`."""
  ids = shd.granule_ids(mesh, layout)
  n = len(set(ids))
  if n < 2:
    return n, []
  return n, dcn_transfers(hlo_lib.Module(hlo) if isinstance(hlo, str) else hlo, ids.__getitem__, len(ids), n)
