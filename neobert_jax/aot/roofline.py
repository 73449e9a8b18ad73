"""A roofline of a compiled program: an estimated step time, op by op (a model, not a measurement); the only
estimate on the GPU compile-only target, beside XLA's cost model on TPU.

For every kernel launched (the entry and the loop bodies it reaches, times the trip counts):
  - matmul     FLOPs = 2 x output elements x contraction length, at hardware.py's achievable rate for that length
               x wave quantization (output tiles over the cores; split-K when the tiles are too few, as cuBLAS).
  - attention  cuDNN flash (forward 4 B N T S H, backward 2.5x) and TPU splash, from their operand shapes as if
               every row were one document (an upper bound for packed rows); rates by key length.
  - collective ring bytes per device at NVLink / ICI speed; the part crossing slices / nodes (collectives.py) at
               the DCN bandwidth.
  - other      bytes read + written at the achievable HBM bandwidth (a slice counts its slice, an in-place update
               its update).
Time per kernel = max(FLOPs / rate, bytes / HBM bandwidth, min_kernel_seconds). Asynchronous collectives overlap
the compute of the computation that issues them; only the excess is exposed. Synchronous ones add."""

import dataclasses
import math
import re
from typing import Any

from neobert_jax import hardware
from neobert_jax.aot import collectives
from neobert_jax.aot import hlo as hlo_lib

# Ops that launch no kernel of their own: structure, metadata, the loops and calls (their bodies are priced).
_FREE = frozenset(
  'parameter constant get-tuple-element tuple bitcast while conditional call after-all partition-id replica-id '
  'add-dependency opt-barrier domain copy-done send-done recv-done get-dimension-size'.split()
)
GPU_MIN_KERNEL_SECONDS = 2e-6  # launch and tail of one kernel on a GPU (assumption; CUDA graphs hide the launch)
TPU_MIN_KERNEL_SECONDS = 0.5e-6
CATEGORIES = {
  'matmul': 'matmuls',
  'attention': 'fused attention',
  'other': 'memory-bound kernels',
  'collective': 'exposed communication',
}


@dataclasses.dataclass
class Op:
  name: str
  category: str  # matmul | attention | collective | other
  label: str  # what it computes (jax's op_name, shortened)
  runs: int  # executions per step
  flops: float  # per execution
  bytes: float  # HBM bytes per execution (link bytes for a collective)
  seconds: float  # per execution
  bound: str  # compute | memory | link | launch
  overlapped: bool = False  # an asynchronous collective

  @property
  def total_seconds(self) -> float:
    return self.runs * self.seconds


@dataclasses.dataclass
class Roofline:
  device_kind: str
  peak_flops: float
  ops: list[Op]
  step_seconds: float
  exposed_comm_seconds: float
  model_flops_per_device: float | None = None

  def seconds(self, category: str) -> float:
    if category == 'collective':
      return self.exposed_comm_seconds
    return sum(o.total_seconds for o in self.ops if o.category == category)

  def flops(self, category: str) -> float:
    return sum(o.runs * o.flops for o in self.ops if o.category == category)

  def bytes(self, category: str) -> float:
    """HBM bytes of a category's kernels per step; link bytes for 'collective'."""
    return sum(o.runs * o.bytes for o in self.ops if o.category == category)

  @property
  def attention_forward_flops(self) -> float:
    """Forward attention FLOPs; x3 is the model convention's attention term (forward + 2x backward)."""
    return sum(o.runs * o.flops for o in self.ops if o.category == 'attention' and '(fwd)' in o.label)

  @property
  def other_share(self) -> float:
    """Share of the step outside matmuls and attention: memory-bound kernels plus exposed communication."""
    return (self.seconds('other') + self.exposed_comm_seconds) / self.step_seconds if self.step_seconds else 0.0

  @property
  def mfu(self) -> float | None:
    if not self.model_flops_per_device or not self.step_seconds:
      return None
    return self.model_flops_per_device / (self.step_seconds * self.peak_flops)

  def as_dict(self, top: int = 15) -> dict[str, Any]:
    return {
      'device_kind': self.device_kind,
      'step_seconds': self.step_seconds,
      'mfu': self.mfu,
      'other_share': self.other_share,
      'model_flops_per_device': self.model_flops_per_device,
      'seconds': {c: self.seconds(c) for c in CATEGORIES},
      'flops': {c: self.flops(c) for c in ('matmul', 'attention')},
      'collective_bytes': self.bytes('collective'),
      'attention_forward_flops': self.attention_forward_flops,
      'top': [
        dataclasses.asdict(o) | {'total_seconds': o.total_seconds}
        for o in sorted(self.ops, key=lambda o: -o.total_seconds)[:top]
      ],
    }


def _label(ins: hlo_lib.Instr) -> str:
  m = re.search(r'op_name="([^"]*)"', ins.attrs)
  name = m.group(1) if m else ins.op
  name = re.sub(r'jit\([^)]*\)/|closed_call/|while/body/|/while/cond|checkpoint/|rematted_computation/', '', name)
  return name.replace('transpose(jvp())', 'bwd').replace('jvp()', 'fwd')[-70:]


def matmul_seconds(acc: hardware.Accelerator, flops: float, batch: int, m: int, n: int, k: int) -> float:
  """FLOPs at the achievable rate for contraction length k, with tile / wave quantization on a GPU."""
  if flops <= 0:
    return 0.0
  util, k_eff = 1.0, k
  if acc.cores > 1:
    tiles = batch * math.ceil(m / acc.tile[0]) * math.ceil(n / acc.tile[1])

    def filled(splits: int) -> float:
      units = tiles * splits
      return units / (math.ceil(units / acc.cores) * acc.cores)

    # split-K (as cuBLAS's heuristics do) when the output tiles leave cores idle and K is long enough to share
    splits = max(range(1, max(1, min(16, k // 512)) + 1), key=lambda s: (round(filled(s), 3), -s))
    util, k_eff = filled(splits), k / splits
  return flops / (acc.matmul_rate(k_eff) * util)


def analyze(
  hlo: str | hlo_lib.Module,
  acc: hardware.Accelerator,
  device_kind: str,
  *,
  num_devices: int,
  dcn: list[collectives.Transfer] = (),
  model_flops_per_device: float | None = None,
  min_kernel_seconds: float = GPU_MIN_KERNEL_SECONDS,
) -> Roofline:
  """The roofline of a compiled program (its text, or parsed); `dcn` its collectives crossing slices / nodes."""
  mod = hlo_lib.Module(hlo) if isinstance(hlo, str) else hlo
  runs = mod.runs
  crossing = {t.name: t.dcn_bytes for t in dcn}
  ops, step, exposed = [], 0.0, 0.0
  for comp in mod.scheduled():
    compute = async_comm = 0.0
    for ins in mod.instrs[comp]:
      op = _price(ins, comp, runs[comp], mod, acc, crossing, num_devices, min_kernel_seconds)
      if op is None:
        continue
      ops.append(op)
      if op.overlapped:
        async_comm += op.seconds
      else:
        compute += op.seconds
        if op.category == 'collective':
          exposed += op.seconds * runs[comp]
    step += runs[comp] * max(compute, async_comm)
    exposed += runs[comp] * max(0.0, async_comm - compute)
  return Roofline(device_kind, acc.peak_bf16_flops, ops, step, exposed, model_flops_per_device)


def _price(ins, comp, runs, mod, acc, crossing, num_devices, min_kernel) -> Op | None:
  """One instruction's kernel (module docstring); None for what launches none."""
  collective = collectives.kind(ins.op)
  if ins.op in _FREE or (collective and collective[1] == '-done'):
    return None
  if collective:
    kind, started = collective
    n = len((collectives.replica_groups(ins.attrs, num_devices) or [[0]])[0])
    per = collectives.ring_bytes(kind, collectives.result_bytes(ins), n)
    seconds = per / ((acc.link_bytes_per_s or acc.hbm_bytes_per_s) * acc.link_efficiency)
    if ins.name in crossing and acc.dcn_bytes_per_s:
      seconds += crossing[ins.name] / acc.dcn_bytes_per_s
    return Op(ins.name, 'collective', f'{kind} x{n}', runs, 0.0, per, seconds, 'link', overlapped=bool(started))
  moved = mod.bytes_moved(ins, comp)
  if hlo_lib.is_attention_call(ins):
    flops, keys, backward = hlo_lib.attention_work(ins, mod.types[comp])
    compute = flops / acc.attention_rate(keys, backward) if flops else 0.0
    category, label = 'attention', f'attention ({"bwd" if backward else "fwd"})'
  else:
    dots = mod.matmuls(ins, comp)
    flops = sum(d[0] for d in dots)
    compute = sum(matmul_seconds(acc, *d) for d in dots)
    category, label = ('matmul' if dots else 'other'), _label(ins)
  memory = moved / (acc.hbm_bytes_per_s * acc.hbm_efficiency)
  seconds = max(compute, memory, min_kernel)
  bound = 'compute' if seconds == compute else 'memory' if seconds == memory else 'launch'
  return Op(ins.name, category, label, runs, flops, moved, seconds, bound)


def format_lines(r: Roofline, model_matmul_flops: float, model_attention_flops: float, top: int = 8) -> list[str]:
  """The report's roofline section (per device per step), with the model formula's terms beside the kernels'."""
  step = r.step_seconds or 1e-30
  mfu = f', est. MFU {r.mfu:.1%} of {r.peak_flops / 1e12:.0f} TFLOP/s' if r.mfu is not None else ''
  lines = [
    f'roofline      {r.step_seconds * 1e3:,.1f} ms/step estimated{mfu} (a model, not a measurement: '
    'aot/roofline.py, rates in hardware.py)'
  ]
  for c, what in CATEGORIES.items():
    s, extra = r.seconds(c), ''
    if c in ('matmul', 'attention') and s:
      extra = f'  {r.flops(c) / 1e12:,.2f} TFLOP at {r.flops(c) / s / 1e12:,.0f} TFLOP/s'
    if c == 'collective':
      extra = (
        f'  {r.bytes(c) / 1e9:,.2f} GB over the links (asynchronous collectives overlap the compute of their '
        'loop body; the rest is exposed)'
      )
    lines.append(f'  {what:22s}{s * 1e3:10,.1f} ms {100 * s / step:5.1f}%{extra}')
  lines.append(f'  outside matmuls and attention: {r.other_share:.1%} of the step')
  if model_matmul_flops:
    lines.append(
      f"  check: dot FLOPs {r.flops('matmul') / 1e12:,.2f} TFLOP vs the model formula's matmul term "
      f'{model_matmul_flops / 1e12:,.2f} (ratio {r.flops("matmul") / model_matmul_flops:.3f})'
    )
  if model_attention_flops and r.attention_forward_flops:
    lines.append(
      f'  check: 3 x attention forward FLOPs {3 * r.attention_forward_flops / 1e12:,.2f} TFLOP vs the '
      f"formula's attention term {model_attention_flops / 1e12:,.2f} "
      f'(ratio {3 * r.attention_forward_flops / model_attention_flops:.3f})'
    )
  # The costliest kernels per step, those computing the same thing (one per layer) taken together.
  groups: dict[tuple[str, str], dict[str, Any]] = {}
  for o in r.ops:
    g = groups.setdefault((o.category, o.label), dict(runs=0, seconds=0.0, flops=0.0, bytes=0.0, bounds=set()))
    g['runs'] += o.runs
    g['seconds'] += o.total_seconds
    g['flops'] += o.runs * o.flops
    g['bytes'] += o.runs * o.bytes
    g['bounds'].add(o.bound)
  lines.append('  costliest kernels (same computation across layers taken together):')
  for (category, label), g in sorted(groups.items(), key=lambda kv: -kv[1]['seconds'])[:top]:
    rate = f', {g["flops"] / g["seconds"] / 1e12:,.0f} TFLOP/s' if g['flops'] and g['seconds'] else ''
    lines.append(
      f'    {g["seconds"] * 1e3:9,.1f} ms  {category:10s} {g["runs"]:5d} runs  '
      f'{g["bytes"] / 1e9:8,.1f} GB{rate}  {"/".join(sorted(g["bounds"])):8s} {label}'
    )
  return lines
