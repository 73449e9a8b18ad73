"""Reading a compiled HLO module's text: computations, instructions, types and how many times each computation runs
per step. Relies only on what XLA prints for every backend; loop trip counts come from `known_trip_count` (GPU,
CPU) or the `i < N` of the loop's condition (TPU)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable

_ARRAY = re.compile(r'([a-z]\w*)\[([\d,]*)\]')
_HEAD = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = ')
_CALLS = re.compile(r'\b(body|condition|calls|to_apply|true_computation|false_computation)=%([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


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


def _element_bytes(dtype: str) -> float:
  """The bit width is the number in an element type's name (s4, bf16, f8e4m3fn, c64); pred is a byte; token 0."""
  if dtype == 'pred':
    return 1
  bits = re.match(r'[a-z]+(\d+)', dtype)
  return int(bits.group(1)) / 8 if bits else 0


def nbytes(text: str) -> float:
  """Bytes of every array in a type (an array or a tuple)."""
  return sum(_element_bytes(d) * math.prod(dims) for d, dims in arrays(text))


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


def _balanced(text: str, start: int) -> int:
  """Index just past the parenthesis group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] == '(':
      depth += 1
    elif text[i] == ')':
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def parse_instr(line: str) -> Instr | None:
  m = _HEAD.match(line)
  if not m:
    return None
  rest = line[m.end() :]
  end = _balanced(rest, 0) if rest.startswith('(') else rest.find(' ')
  type_, rest = rest[:end], rest[end:].lstrip()
  op_end = rest.find('(')
  if op_end < 0:
    return None
  close = _balanced(rest, op_end)
  operands = re.findall(r'%([\w.\-]+)', rest[op_end:close])
  return Instr(
    m.group(1),
    type_,
    rest[:op_end],
    operands,
    rest[close:],
    line.lstrip().startswith('ROOT '),
    rest[op_end + 1 : close - 1],
  )


def computations(hlo: str) -> tuple[str | None, dict[str, list[str]]]:
  """(the entry computation's name, {computation name: its instruction lines})."""
  entry, comps, name = None, {}, None
  for line in hlo.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith('{'):
      head = line.split('(', 1)[0].split()
      name = head[-1].lstrip('%')
      comps[name] = []
      if head[0] == 'ENTRY':
        entry = name
    elif line.rstrip() == '}':
      name = None
    elif name is not None and line and not line[0].isspace() and comps[name]:
      # A string attribute holding a newline (a TPU Mosaic call's kernel_metadata) continues the instruction on
      # an unindented line, which may start with '}}': it is not the end of the computation.
      comps[name][-1] += '\n' + line
    elif name is not None:
      comps[name].append(line)
  return entry, comps


def called(ins: Instr) -> list[str]:
  """Computations an instruction calls (fusion and loop bodies, branches, reduction functions, ...)."""
  names = [c for _, c in _CALLS.findall(ins.attrs)]
  for block in _BRANCHES.findall(ins.attrs):
    names += re.findall(r'%([\w.\-]+)', block)
  return names


class Module:
  """A module's text parsed once: instructions and result types per computation, and runs per step."""

  def __init__(self, hlo: str):
    self.entry, comps = computations(hlo)
    self.instrs = {c: [i for i in map(parse_instr, lines) if i is not None] for c, lines in comps.items()}
    self.types = {c: {i.name: i.type for i in ins} for c, ins in self.instrs.items()}
    self.runs = self._runs()

  def _trip_count(self, loop: Instr) -> int:
    """A while loop's trip count: XLA's annotation, else the `i < N` of its condition; 1 if neither."""
    m = _TRIP.search(loop.attrs)
    if m:
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
        times = self._trip_count(ins) if ins.op == 'while' else 1
        for child in called(ins):
          callers.setdefault(child, []).append((parent, times))
    memo: dict[str, int] = {}

    def count(name: str) -> int:
      if name not in memo:
        memo[name] = 1 if name == self.entry else sum(count(p) * f for p, f in callers.get(name, []))
      return memo[name]

    return {name: count(name) for name in self.instrs}

  def reachable(self, comp: str, through: Callable[[Instr], bool] = lambda ins: True) -> list[str]:
    """comp and what it calls, transitively, through the instructions `through` accepts."""
    out, todo = [], [comp]
    while todo:
      c = todo.pop()
      if c not in out and c in self.instrs:
        out.append(c)
        todo += [x for ins in self.instrs[c] if through(ins) for x in called(ins)]
    return out

  def scheduled(self) -> list[str]:
    """Computations whose instructions run as kernels: the entry and what it reaches through loops,
    conditionals and calls."""
    return self.reachable(self.entry, lambda ins: ins.op in ('while', 'conditional', 'call'))
