"""What each kernel of a compiled program computes and moves: FLOPs of its dots and fused attention calls, and
the HBM bytes a fusion reads and writes; roofline.py prices them."""

from __future__ import annotations

import math
import re
from typing import Callable

from neobert_jax.aot import hlo as hlo_lib

SLICES = {'dynamic-slice', 'slice', 'gather'}
IN_PLACE = {'dynamic-update-slice', 'scatter'}


def updates(ins: hlo_lib.Instr) -> list[str]:
  """The operands an in-place update writes: a dynamic-update-slice's update, a scatter's updates."""
  if ins.op == 'scatter':
    n = (len(ins.operands) - 1) // 2
    return ins.operands[n + 1 :]
  return ins.operands[1:2]


class KernelCosts(hlo_lib.Module):
  """A parsed module (hlo.py) that also counts what its instructions compute and move."""

  def matmuls(self, ins: hlo_lib.Instr, comp: str) -> list[tuple[float, int, int, int, int]]:
    """(FLOPs, batch, M, N, K) of every dot / convolution an instruction runs (in its fusion, or
    itself: a cuBLAS call too)."""
    if ins.op == 'fusion':
      return [
        dot_shape(i, self.types[c])
        for c in self.reachable(hlo_lib.called(ins)[0])
        for i in self.instrs[c]
        if i.op in ('dot', 'convolution')
      ]
    if ins.op in ('dot', 'convolution') or (ins.op == 'custom-call' and re.search(r'gemm|matmul', ins.attrs)):
      return [dot_shape(ins, self.types[comp])]
    return []

  def bytes_moved(self, ins: hlo_lib.Instr, comp: str) -> float:
    """HBM bytes an instruction reads and writes: a slice only its slice, an in-place update only its update."""
    size = lambda name: hlo_lib.nbytes(self.types[comp].get(name, ''))
    if ins.op == 'fusion':
      return self._fusion_bytes(ins, size)
    if ins.op in SLICES:
      return 2 * hlo_lib.nbytes(ins.type)
    if ins.op in IN_PLACE:
      return 2 * sum(size(u) for u in updates(ins))
    return sum(size(o) for o in ins.operands) + hlo_lib.nbytes(ins.type)

  def _fusion_bytes(self, ins: hlo_lib.Instr, size: Callable[[str], float]) -> float:
    """Each operand (or only the slices its body reads), and the output (or only the update
    of an in-place dynamic-update-slice or scatter)."""
    body = self.instrs.get(hlo_lib.called(ins)[0], [])
    named = {i.name: i for i in body}
    users: dict[str, list[hlo_lib.Instr]] = {}
    for i in body:
      for o in i.operands:
        users.setdefault(o, []).append(i)

    def uses(name: str) -> list[tuple[str, hlo_lib.Instr]]:  # (the alias used, user), through bitcasts
      out = []
      for u in users.get(name, []):
        out += uses(u.name) if u.op == 'bitcast' else [(name, u)]
      return out

    moved = 0.0
    params = {int(i.args): i for i in body if i.op == 'parameter' and i.args.strip().isdigit()}
    for k, operand in enumerate(ins.operands):
      us = uses(params[k].name) if k in params else []
      if us and all(u.op in SLICES and u.operands[0] == a for a, u in us):
        moved += sum(hlo_lib.nbytes(u.type) for _, u in us)
      elif us and all(u.op in IN_PLACE and u.operands[0] == a for a, u in us):
        continue  # the in-place buffer: only the update is written
      else:
        moved += size(operand)
    root = next((i for i in body if i.root), None)
    if root is None:
      return moved + hlo_lib.nbytes(ins.type)
    for out in [named[o] for o in root.operands if o in named] if root.op == 'tuple' else [root]:
      written = [named[u] for u in updates(out) if u in named] if out.op in IN_PLACE else [out]
      moved += sum(hlo_lib.nbytes(w.type) for w in written)
    return moved


def _dims(attrs: str, key: str) -> list[int]:
  m = re.search(key + r'=\{([\d,]*)\}', attrs)
  return [int(x) for x in m.group(1).split(',') if x] if m else []


def _window(attrs: str) -> dict[str, list[str]]:
  """A convolution's window attribute, per field: {'size': ['1', '12'], 'pad': ['0_0', '11_11'], ...}."""
  m = re.search(r'window=\{([^}]*)\}', attrs)
  fields = (f.split('=', 1) for f in (m.group(1).split() if m else []) if '=' in f)
  return {key: value.split('x') for key, value in fields}


def _taps(window: dict[str, list[str]], i: int, size_in: int, size_out: int) -> float:
  """Average window taps of spatial dimension i that land on the input: the TPU compiler writes some plain
  contractions as convolutions whose window mostly covers padding, and only real taps are work."""
  field = lambda key, default: window[key][i] if i < len(window.get(key, ())) else default
  w = int(field('size', '1'))
  lo = int(field('pad', '0_0').split('_')[0])
  stride, rd, ld = (int(field(key, '1')) for key in ('stride', 'rhs_dilate', 'lhs_dilate'))
  span = (size_in - 1) * ld
  hits = sum(
    1
    for o in range(size_out)
    for j in range(w)
    if 0 <= o * stride + j * rd - lo <= span and (o * stride + j * rd - lo) % ld == 0
  )
  return hits / max(size_out, 1)


def dot_shape(ins: hlo_lib.Instr, types: dict[str, str]) -> tuple[float, int, int, int, int]:
  out = hlo_lib.arrays(ins.type)
  lhs = hlo_lib.arrays(types.get(ins.operands[0], ''))
  rhs = hlo_lib.arrays(types.get(ins.operands[1], '')) if len(ins.operands) > 1 else []
  if not out or not lhs or not rhs:
    return 0.0, 1, 1, 1, 1
  out_elems = math.prod(out[0][1])
  ldims, rdims = lhs[0][1], rhs[0][1]
  if ins.op == 'convolution':  # dim_labels=b0f_0io->b0f: the input features and the window taps contract
    labels = re.search(r'dim_labels=(\w+)_(\w+)->(\w+)', ins.attrs)
    if not labels:
      return 2.0 * out_elems, 1, out_elems, 1, 1
    lhs_l, rhs_l, out_l = labels.groups()
    k = math.prod(d for d, c in zip(rdims, rhs_l) if c == 'i')
    odims, window = out[0][1], _window(ins.attrs)
    for digit in sorted(c for c in rhs_l if c.isdigit()):
      k *= _taps(window, int(digit), ldims[lhs_l.index(digit)], odims[out_l.index(digit)])
    n = rdims[rhs_l.index('o')]
    return 2.0 * out_elems * k, 1, out_elems // max(n, 1), n, max(int(round(k)), 1)
  lc, rc = _dims(ins.attrs, 'lhs_contracting_dims'), _dims(ins.attrs, 'rhs_contracting_dims')
  lb, rb = _dims(ins.attrs, 'lhs_batch_dims'), _dims(ins.attrs, 'rhs_batch_dims')
  k = math.prod(ldims[i] for i in lc)
  batch = math.prod(ldims[i] for i in lb)
  m = math.prod(d for i, d in enumerate(ldims) if i not in lc and i not in lb)
  n = math.prod(d for i, d in enumerate(rdims) if i not in rc and i not in rb)
  return 2.0 * out_elems * k, batch, m, n, k


# A fused attention kernel, by the call's name or attributes: cuDNN (custom_call_target="__cudnn$fmha..."), the TPU
# splash Mosaic kernels (named %splash_mha_fwd..., _dq, _dkv) and Pallas GPU flash attention (mha_fwd / mha_bwd).
_ATTENTION_CALL = re.compile(r'__cudnn\$fmha|splash_mha|flash_attention|mha_(?:fwd|bwd)')


def is_attention_call(ins: hlo_lib.Instr) -> bool:
  """Whether an instruction is a fused attention kernel whose work attention_work prices."""
  return ins.op == 'custom-call' and bool(_ATTENTION_CALL.search(f'{ins.name} {ins.attrs}'))


def attention_work(ins: hlo_lib.Instr, types: dict[str, str]) -> tuple[float, int, bool]:
  """(FLOPs, key length, backward?) of a fused attention call from its q / k shapes: a TPU Mosaic
  call's q and k are its first two floating-point operands of rank >= 3, its direction read from name and target."""
  target = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
  tag = f'{ins.name} {target.group(1) if target else ""}'
  constraint = ins.attrs.partition('operand_layout_constraints=')[2].split('}}', 1)[0]
  shapes = hlo_lib.arrays(constraint) or [a for o in ins.operands[:2] for a in hlo_lib.arrays(types.get(o, ''))[:1]]
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
