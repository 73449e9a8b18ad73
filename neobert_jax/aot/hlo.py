"""A compiled HLO module's text, read for the roofline: instructions and types per computation, runs per step (loop
trip counts: XLA's `known_trip_count`, or the `i < N` of the loop's condition on TPU), and what each kernel computes
(dot, convolution and fused-attention FLOPs) and moves (HBM bytes). Relies only on what XLA prints for every
backend."""

import dataclasses
import functools
import math
import re

_ARRAY = re.compile(r'([a-z]\w*)\[([\d,]*)\]')
_HEAD = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = ')
_CALLS = re.compile(r'\b(body|condition|calls|to_apply|true_computation|false_computation)=%([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
SLICES = {'dynamic-slice', 'slice', 'gather'}
IN_PLACE = {'dynamic-update-slice', 'scatter'}
# A fused attention kernel, by the call's name or attributes: cuDNN (custom_call_target="__cudnn$fmha..."), the TPU
# splash Mosaic kernels (named %splash_mha_fwd..., _dq, _dkv) and Pallas GPU flash attention (mha_fwd / mha_bwd).
_ATTENTION_CALL = re.compile(r'__cudnn\$fmha|splash_mha|flash_attention|mha_(?:fwd|bwd)')


@dataclasses.dataclass
class Instr:
  name: str
  type: str  # the result type as printed (an array or a tuple)
  op: str  # 'fusion', 'custom-call', 'all-gather-start', ...
  operands: list[str]
  attrs: str  # everything after the operand list
  root: bool = False
  args: str = ''  # the operand list as printed (a parameter's number, a constant's value)


def _strip(text: str) -> str:
  text = re.sub(r'/\*.*?\*/', '', text)
  return re.sub(r'\]\{[^}]*\}', ']', text)  # drop layouts ({1,0:T(8,128)} holds parentheses)


def arrays(text: str) -> list[tuple[str, tuple[int, ...]]]:
  """Every array of a type, flattened: [(dtype, dims), ...]."""
  return [(d, tuple(int(x) for x in dims.split(',') if x)) for d, dims in _ARRAY.findall(_strip(text))]


def _bits(dtype: str) -> int:
  """The number in an element type's name (s4, bf16, f8e4m3fn, c64); pred is a byte, a token nothing."""
  m = re.match(r'[a-z]+(\d+)', dtype)
  return 8 if dtype == 'pred' else int(m.group(1)) if m else 0


def nbytes(text: str) -> float:
  """Bytes of every array in a type (an array or a tuple)."""
  return sum(_bits(d) / 8 * math.prod(dims) for d, dims in arrays(text))


def _balanced(text: str, start: int) -> int:
  """Index just past the parenthesis group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    depth += (text[i] == '(') - (text[i] == ')')
    if depth == 0:
      return i + 1
  return len(text)


def elements(text: str) -> list[str]:
  """A tuple type's elements as printed (nested tuples whole); an array type is its own one element."""
  text = _strip(text).strip()
  if not text.startswith('('):
    return [text]
  parts, depth, start = [], 0, 1
  for i, ch in enumerate(text[: _balanced(text, 0)]):
    depth += (ch in '([') - (ch in ')]')
    if depth == 0 or (depth == 1 and ch == ','):
      parts.append(text[start:i].strip())
      start = i + 1
  return parts


def parse_instr(line: str) -> Instr | None:
  if not (m := _HEAD.match(line)):
    return None
  rest = line[m.end() :]
  end = _balanced(rest, 0) if rest.startswith('(') else rest.find(' ')
  type_, rest = rest[:end], rest[end:].lstrip()
  op_end = rest.find('(')
  if op_end < 0:
    return None
  close = _balanced(rest, op_end)
  operands = re.findall(r'%([\w.\-]+)', rest[op_end:close])
  root = line.lstrip().startswith('ROOT ')
  return Instr(m.group(1), type_, rest[:op_end], operands, rest[close:], root, rest[op_end + 1 : close - 1])


def called(ins: Instr) -> list[str]:
  """Computations an instruction calls (fusion and loop bodies, branches, reduction functions, ...)."""
  names = [c for _, c in _CALLS.findall(ins.attrs)]
  for block in _BRANCHES.findall(ins.attrs):
    names += re.findall(r'%([\w.\-]+)', block)
  return names


def updates(ins: Instr) -> list[str]:
  """The operands an in-place update writes: a dynamic-update-slice's update, a scatter's updates."""
  return ins.operands[(len(ins.operands) - 1) // 2 + 1 :] if ins.op == 'scatter' else ins.operands[1:2]


class Module:
  """A module's text parsed once: instructions and types per computation, runs per step, FLOPs and bytes moved."""

  def __init__(self, hlo: str):
    self.entry, comps, name = None, {}, None
    for line in hlo.splitlines():
      if line and not line[0].isspace() and line.rstrip().endswith('{'):
        head = line.split('(', 1)[0].split()
        name = head[-1].lstrip('%')
        comps[name] = []
        self.entry = name if head[0] == 'ENTRY' else self.entry
      elif line.rstrip() == '}':
        name = None
      elif name is not None and line and not line[0].isspace() and comps[name]:
        # A string attribute holding a newline (a TPU Mosaic call's kernel_metadata) continues the instruction on
        # an unindented line, which may start with '}}': it is not the end of the computation.
        comps[name][-1] += '\n' + line
      elif name is not None:
        comps[name].append(line)
    self.instrs = {c: [i for i in map(parse_instr, lines) if i is not None] for c, lines in comps.items()}
    self.types = {c: {i.name: i.type for i in ins} for c, ins in self.instrs.items()}
    self.runs = self._runs()

  def _trip_count(self, loop: Instr) -> int:
    """A while loop's trip count: XLA's annotation, else the `i < N` of its condition; 1 if neither."""
    if m := _TRIP.search(loop.attrs):
      return int(m.group(1))
    cond = self.instrs.get(next((c for role, c in _CALLS.findall(loop.attrs) if role == 'condition'), ''), [])
    consts = {
      i.name: int(i.args) for i in cond if i.op == 'constant' and _strip(i.type) == 's32[]' and i.args.isdigit()
    }
    for i in cond:
      if i.op == 'compare' and 'direction=LT' in i.attrs and len(i.operands) == 2 and i.operands[1] in consts:
        return consts[i.operands[1]]
    return 1

  def _runs(self) -> dict[str, int]:
    """Runs of each computation per call of the entry (a conditional's branches once each: an upper bound)."""
    callers: dict[str, list[tuple[str, int]]] = {}
    for parent, body in self.instrs.items():
      for ins in body:
        for child in called(ins):
          callers.setdefault(child, []).append((parent, self._trip_count(ins) if ins.op == 'while' else 1))

    @functools.cache
    def count(name: str) -> int:
      return 1 if name == self.entry else sum(count(p) * f for p, f in callers.get(name, []))

    return {name: count(name) for name in self.instrs}

  def reachable(self, comp: str, through=lambda ins: True) -> list[str]:
    """comp and what it calls, transitively, through the instructions `through` accepts."""
    out, todo = [], [comp]
    while todo:
      c = todo.pop()
      if c not in out and c in self.instrs:
        out.append(c)
        todo += [x for ins in self.instrs[c] if through(ins) for x in called(ins)]
    return out

  def scheduled(self) -> list[str]:
    """Computations whose instructions run as kernels: the entry and what it reaches through loops, calls."""
    return self.reachable(self.entry, lambda ins: ins.op in ('while', 'conditional', 'call'))

  def matmuls(self, ins: Instr, comp: str) -> list[tuple[float, int, int, int, int]]:
    """(FLOPs, batch, M, N, K) of each dot / convolution an instruction runs: in its fusion, or itself (cuBLAS)."""
    if ins.op == 'fusion':
      return [
        dot_shape(i, self.types[c])
        for c in self.reachable(called(ins)[0])
        for i in self.instrs[c]
        if i.op in ('dot', 'convolution')
      ]
    if ins.op in ('dot', 'convolution') or (ins.op == 'custom-call' and re.search(r'gemm|matmul', ins.attrs)):
      return [dot_shape(ins, self.types[comp])]
    return []

  def bytes_moved(self, ins: Instr, comp: str) -> float:
    """HBM bytes an instruction reads and writes: a slice only its slice, an in-place update only its update."""
    size = lambda name: nbytes(self.types[comp].get(name, ''))
    if ins.op in SLICES:
      return 2 * nbytes(ins.type)
    if ins.op in IN_PLACE:
      return 2 * sum(size(u) for u in updates(ins))
    if ins.op != 'fusion':
      return sum(size(o) for o in ins.operands) + nbytes(ins.type)
    # A fusion: each operand (or only the slices its body reads), and the output (or only the update of an in-place
    # dynamic-update-slice or scatter).
    body = self.instrs.get(called(ins)[0], [])
    named = {i.name: i for i in body}
    users: dict[str, list[Instr]] = {}
    for i in body:
      for o in i.operands:
        users.setdefault(o, []).append(i)

    def uses(name: str) -> list[tuple[str, Instr]]:  # (the alias used, user), through bitcasts
      return [x for u in users.get(name, []) for x in (uses(u.name) if u.op == 'bitcast' else [(name, u)])]

    moved = 0.0
    params = {int(i.args): i for i in body if i.op == 'parameter' and i.args.strip().isdigit()}
    for k, operand in enumerate(ins.operands):
      us = uses(params[k].name) if k in params else []
      if us and all(u.op in SLICES and u.operands[0] == a for a, u in us):
        moved += sum(nbytes(u.type) for _, u in us)
      elif not (us and all(u.op in IN_PLACE and u.operands[0] == a for a, u in us)):  # in place: the update only
        moved += size(operand)
    root = next((i for i in body if i.root), None)
    if root is None:
      return moved + nbytes(ins.type)
    for out in [named[o] for o in root.operands if o in named] if root.op == 'tuple' else [root]:
      written = [named[u] for u in updates(out) if u in named] if out.op in IN_PLACE else [out]
      moved += sum(nbytes(w.type) for w in written)
    return moved


def _dims(attrs: str, key: str) -> list[int]:
  m = re.search(key + r'=\{([\d,]*)\}', attrs)
  return [int(x) for x in m.group(1).split(',') if x] if m else []


def _taps(window: dict[str, list[str]], i: int, size_in: int, size_out: int) -> float:
  """Average window taps of spatial dimension i that land on the input: the TPU compiler writes some plain
  contractions as convolutions whose window mostly covers padding, and only real taps are work."""
  field = lambda key, default: window[key][i] if i < len(window.get(key, ())) else default
  w, lo = int(field('size', '1')), int(field('pad', '0_0').split('_')[0])
  stride, rd, ld = (int(field(key, '1')) for key in ('stride', 'rhs_dilate', 'lhs_dilate'))
  span = (size_in - 1) * ld
  hits = sum(
    1 for o in range(size_out) for j in range(w) if 0 <= (x := o * stride + j * rd - lo) <= span and x % ld == 0
  )
  return hits / max(size_out, 1)


def dot_shape(ins: Instr, types: dict[str, str]) -> tuple[float, int, int, int, int]:
  out = arrays(ins.type)
  lhs = arrays(types.get(ins.operands[0], ''))
  rhs = arrays(types.get(ins.operands[1], '')) if len(ins.operands) > 1 else []
  if not out or not lhs or not rhs:
    return 0.0, 1, 1, 1, 1
  out_elems, ldims, rdims = math.prod(out[0][1]), lhs[0][1], rhs[0][1]
  if ins.op == 'convolution':  # dim_labels=b0f_0io->b0f: the input features and the window taps contract
    if not (labels := re.search(r'dim_labels=(\w+)_(\w+)->(\w+)', ins.attrs)):
      return 2.0 * out_elems, 1, out_elems, 1, 1
    lhs_l, rhs_l, out_l = labels.groups()
    k = math.prod(d for d, c in zip(rdims, rhs_l) if c == 'i')
    m = re.search(r'window=\{([^}]*)\}', ins.attrs)  # {size=1x12 pad=0_0x11_11 ...}: per field, per dimension
    window = dict(f.split('=', 1) for f in (m.group(1).split() if m else []) if '=' in f)
    window = {key: value.split('x') for key, value in window.items()}
    for digit in sorted(c for c in rhs_l if c.isdigit()):
      k *= _taps(window, int(digit), ldims[lhs_l.index(digit)], out[0][1][out_l.index(digit)])
    n = rdims[rhs_l.index('o')]
    return 2.0 * out_elems * k, 1, out_elems // max(n, 1), n, max(int(round(k)), 1)
  lc, rc = _dims(ins.attrs, 'lhs_contracting_dims'), _dims(ins.attrs, 'rhs_contracting_dims')
  lb, rb = _dims(ins.attrs, 'lhs_batch_dims'), _dims(ins.attrs, 'rhs_batch_dims')
  k = math.prod(ldims[i] for i in lc)
  batch = math.prod(ldims[i] for i in lb)
  m = math.prod(d for i, d in enumerate(ldims) if i not in lc and i not in lb)
  n = math.prod(d for i, d in enumerate(rdims) if i not in rc and i not in rb)
  return 2.0 * out_elems * k, batch, m, n, k


def is_attention_call(ins: Instr) -> bool:
  """Whether an instruction is a fused attention kernel whose work attention_work prices."""
  return ins.op == 'custom-call' and bool(_ATTENTION_CALL.search(f'{ins.name} {ins.attrs}'))


def attention_work(ins: Instr, types: dict[str, str]) -> tuple[float, int, bool]:
  """(FLOPs, key length, backward?) of a fused attention call from its q / k shapes: a TPU Mosaic call's q and k
  are its first two floating-point operands of rank >= 3, its direction read from name and target."""
  target = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
  tag = f'{ins.name} {target.group(1) if target else ""}'
  constraint = ins.attrs.partition('operand_layout_constraints=')[2].split('}}', 1)[0]
  shapes = arrays(constraint) or [a for o in ins.operands[:2] for a in arrays(types.get(o, ''))[:1]]
  backward = bool(re.search(r'Backward|_dq|_dkv|bwd', tag))
  if 'cudnn' not in tag:
    shapes = [a for a in shapes if a[0] in ('bf16', 'f16', 'f32') and len(a[1]) >= 3]
  if len(shapes) < 2 or len(shapes[0][1]) < 3:
    return 0.0, 1, backward
  q, kv = shapes[0][1], shapes[1][1]
  if 'cudnn' in tag:  # BTNH
    b, t, heads, d = q
    s = kv[1]
    work = 4.0 * b * heads * t * s * d
  else:  # splash: [.., heads, T, D] per example
    d, t, s = q[-1], q[-2], kv[-2]
    work = 4.0 * math.prod(q[:-2]) * t * s * d
  if re.search(r'_dq\b|_dq_', tag):
    work *= 1.5  # dq alone: recompute QK^T, dO V^T, dS K
  elif re.search(r'_dkv', tag):
    work *= 2.0  # dk, dv: QK^T, dO V^T, P^T dO, dS^T Q
  elif backward:
    work *= 2.5
  return work, s, backward
