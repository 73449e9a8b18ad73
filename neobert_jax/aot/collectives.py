"""Which collectives of a compiled program cross the data-centre network (DCN) between slices / nodes, and how
many bytes each device sends over it per step.

Two ways a compiled program says it crosses the DCN:
  - GPU / CPU: an ordinary collective (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute)
    whose replica groups hold devices of different slices or nodes. Group members are partition ids, i.e.
    positions in the mesh's flattened device array; `granule_of(position)` says which slice / node that is.
  - TPU multi-slice: the compiler splits each such collective into an in-slice collective (slice-local ids)
    plus a `send` to the DCN runtime (`_xla_megascale_transfer_type=...`); those sends ARE the DCN traffic.

Bytes per execution, per device, as a hierarchical algorithm moves them (inside the slice first, then k slices
exchanging over the DCN; a collective whose groups are spread over k granules with m members in each):
  all-gather      shard x (k - 1)             every counterpart's shard comes over the DCN
  reduce-scatter  (S / m) x (k - 1) / k       S the full operand; reduced in-slice first
  all-reduce      2 x (S / m) x (k - 1) / k   a reduce-scatter then an all-gather over the k slices
  all-to-all      S x (k - 1) / k             the share bound for other slices
  collective-permute  S                       for the pairs whose ends are in different slices
Per step: each is multiplied by how often its computation runs (loop trip counts: the layer scan, the
micro-batch loop), so a per-layer gather inside the scan counts once per layer.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Iterable

import numpy as np

KINDS = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all', 'collective-permute')

_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2, 's32': 4, 'u32': 4,
                'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8, 'c128': 16, 's4': 0.5, 'u4': 0.5}
_ARRAY = re.compile(r'([a-z]\w*)\[([\d,]*)\]')
_INSTR = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = (.*)$')
_COLLECTIVE = re.compile(r'^(?P<type>.*?) (?P<op>' + '|'.join(KINDS) + r')(?P<start>-start)?\((?P<rest>.*)$')
_CALLS = re.compile(r'\b(body|condition|calls|to_apply|true_computation|false_computation)=%([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


@dataclasses.dataclass
class Transfer:
  """One collective that crosses the DCN."""
  kind: str           # one of KINDS
  name: str           # the HLO instruction
  per_step: int       # executions per step (enclosing loops' trip counts multiplied)
  granules: int       # slices / nodes one of its groups spans
  dcn_bytes: float    # bytes each device sends over the DCN per execution

  @property
  def bytes_per_step(self) -> float:
    return self.per_step * self.dcn_bytes


def _type_sizes(text: str):
  """An HLO type -> its bytes: an int for an array, a list (nested) for a tuple."""
  text = re.sub(r'/\*.*?\*/', '', text)
  text = re.sub(r'\]\{[^}]*\}', ']', text)          # drop layouts ({1,0:T(8,128)} holds parentheses)
  tokens = re.findall(r'\(|\)|[a-z]\w*\[[\d,]*\]', text)
  pos = 0

  def parse():
    nonlocal pos
    tok = tokens[pos]
    pos += 1
    if tok == '(':
      items = []
      while tokens[pos] != ')':
        items.append(parse())
      pos += 1
      return items
    dtype, dims = _ARRAY.fullmatch(tok).groups()
    return _DTYPE_BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(',') if d)

  return parse() if tokens else 0


def _total(sizes) -> float:
  return sum(_total(s) for s in sizes) if isinstance(sizes, list) else sizes


def _iota(reshape: list[int], perm: list[int] | None) -> np.ndarray:
  ids = np.arange(math.prod(reshape)).reshape(reshape)
  return ids.transpose(perm) if perm else ids


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(',') if x.strip()]


def replica_groups(attrs: str, num_devices: int) -> list[list[int]] | None:
  """The groups of a collective's attributes, in any of XLA's spellings; None when it has none we can read."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))? \{([^}]*)\}",
                attrs)
  if m:   # mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}: groups vary along the named axes
    axes = re.findall(r"'(\w+)'=(\d+)", m.group(1))
    sizes = [int(s) for _, s in axes]
    ids = (_iota(_ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None) if m.group(2)
           else np.arange(math.prod(sizes))).reshape(sizes)
    names = [a for a, _ in axes]
    over = [names.index(a) for a in re.findall(r"'(\w+)'", m.group(4))]
    if not over:
      return None
    rest = [i for i in range(len(sizes)) if i not in over]
    return ids.transpose(rest + over).reshape(-1, math.prod(sizes[i] for i in over)).tolist()
  m = re.search(r'replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?', attrs)
  if m:   # iota form: [2,4]<=[8] or [4,2]<=[2,4]T(1,0)
    ids = _iota(_ints(m.group(3)), _ints(m.group(4)) if m.group(4) else None)
    return ids.reshape(int(m.group(1)), int(m.group(2))).tolist()
  m = re.search(r'replica_groups=\{((?:\{[\d,]*\},?)*)\}', attrs)
  if m:   # explicit {{0,1},{2,3}}; {} = every device in one group
    groups = [_ints(g) for g in re.findall(r'\{([\d,]*)\}', m.group(1))]
    return groups or [list(range(num_devices))]
  m = re.search(r'source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}', attrs)
  if m:
    return [_ints(p) for p in re.findall(r'\{(\d+,\d+)\}', m.group(1))]
  return None


def _hierarchical_bytes(kind: str, data: float, k: int) -> float:
  """Bytes a device sends over the DCN when `data` is its part of the exchange between k slices (docstring)."""
  if kind == 'all-gather':
    return data * (k - 1)
  if kind == 'all-reduce':
    return 2 * data * (k - 1) / k
  if kind == 'collective-permute':
    return data
  return data * (k - 1) / k


def _computations(hlo: str) -> dict[str, list[str]]:
  comps, name = {}, None
  for line in hlo.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith('{'):
      head = line.split('(', 1)[0].split()
      name = head[-1].lstrip('%')
      comps[name] = ['ENTRY'] if head[0] == 'ENTRY' else []
    elif line.startswith('}'):
      name = None
    elif name is not None:
      comps[name].append(line)
  return comps


def _trip_count(line: str, comps: dict[str, list[str]], condition: str) -> int | None:
  """A while loop's trip count: XLA's own annotation (GPU, CPU), else the `i < N` of its condition (TPU keeps the
  scan counter starting at 0)."""
  m = _TRIP.search(line)
  if m:
    return int(m.group(1))
  consts = {}
  for ins in comps.get(condition, []):
    c = re.match(r'^\s*(?:ROOT )?%([\w.\-]+) = s32\[\]\S* constant\((\d+)\)', ins)
    if c:
      consts[c.group(1)] = int(c.group(2))
  for ins in comps.get(condition, []):
    if ' compare(' in ins and 'direction=LT' in ins:
      operands = re.findall(r'%([\w.\-]+)', ins.split(' compare(', 1)[1].split(')', 1)[0])
      if len(operands) == 2 and operands[1] in consts:
        return consts[operands[1]]
  return None


def executions(comps: dict[str, list[str]]) -> dict[str, int]:
  """How many times each computation runs per call of the entry computation."""
  callers: dict[str, list[tuple[str, int]]] = {}
  for parent, lines in comps.items():
    for line in lines:
      calls = _CALLS.findall(line)
      cond = next((c for role, c in calls if role == 'condition'), None)
      trips = _trip_count(line, comps, cond) if cond else None
      for role, child in calls:
        callers.setdefault(child, []).append((parent, (trips or 1) if role in ('body', 'condition') else 1))
      for block in _BRANCHES.findall(line):
        for child in re.findall(r'%([\w.\-]+)', block):
          callers.setdefault(child, []).append((parent, 1))   # at most once each: an upper bound
  memo: dict[str, int] = {}

  def count(name: str) -> int:
    if name not in memo:
      lines = comps.get(name, [])
      memo[name] = 1 if lines[:1] == ['ENTRY'] else sum(count(p) * f for p, f in callers.get(name, []))
    return memo[name]

  return {name: count(name) for name in comps}


def dcn_transfers(hlo: str, granule_of: Callable[[int], int], num_devices: int,
                  num_granules: int) -> list[Transfer]:
  """The DCN-crossing collectives of a compiled program (module docstring), in program order."""
  comps = _computations(hlo)
  runs = executions(comps)
  # A TPU multi-slice program numbers its in-slice collectives with slice-local ids; its DCN traffic is the sends.
  multislice = '_xla_megascale_transfer_type' in hlo
  out = []
  for comp, lines in comps.items():
    for line in lines:
      m = _INSTR.match(line)
      if not m:
        continue
      name, rhs = m.groups()
      mega = re.search(r'_xla_megascale_transfer_type="(\w+)"', rhs)
      if mega and ' send(' in rhs:
        kind = mega.group(1).lower().replace('_', '-')
        payload = _total(_type_sizes(rhs.split(' send(', 1)[0])[0])
        out.append(Transfer(kind, name, runs[comp], num_granules,
                            _hierarchical_bytes(kind, payload, num_granules)))
        continue
      c = None if multislice else _COLLECTIVE.match(rhs)
      if not c:
        continue
      kind, sizes = c.group('op'), _type_sizes(c.group('type'))
      if c.group('start') and kind != 'all-reduce':
        sizes = sizes[1]   # async start: (operands, results[, context]); all-reduce-start gives the results alone
      result = _total(sizes)
      groups = replica_groups(c.group('rest'), num_devices)
      if not groups:
        continue
      spans = [{granule_of(d) for d in g} for g in groups]
      k = max(len(s) for s in spans)
      if k < 2:
        continue
      g = len(groups[0])
      if kind == 'collective-permute':
        data = result * sum(len(s) > 1 for s in spans) / len(spans)
      else:
        data = {'all-gather': result / g, 'reduce-scatter': result * k, 'all-reduce': result * k / g,
                'all-to-all': result}[kind]
      out.append(Transfer(kind, name, runs[comp], k, _hierarchical_bytes(kind, data, k)))
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


def for_mesh(hlo: str, mesh, layout=None) -> tuple[int, list[Transfer]]:
  """(slices / nodes the mesh spans, the program's DCN transfers) for a program compiled on `mesh`."""
  from neobert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  ids = shd.granule_ids(mesh, layout)
  n = len(set(ids))
  return n, (dcn_transfers(hlo, ids.__getitem__, len(ids), n) if n > 1 else [])
