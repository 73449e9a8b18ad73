"""What a compiled executable tells us, per device: memory, whether it fits, FLOPs, the attention kernels, and
what crosses the data-centre network (aot/collectives.py).

Memory is XLA's buffer assignment: total = arguments + outputs - aliased (the donated state) + temporaries + code.
'fits' compares it with headroom x device memory: the runtime keeps some memory for itself."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# cuDNN fused attention custom calls (forward + backward; Softmax = padding/no mask, ScaleBias = boolean mask).
_CUDNN_RE = re.compile(r'__cudnn\$fmha\w+')
# Pallas kernels keep their name in the compiled TPU program: the Mosaic custom call is named after the kernel
# (%splash_mha_fwd_segmented_residuals.1 = ... custom_call_target="tpu_custom_call"). Only such calls count: an
# interpret-mode emulation carries the same names in its ops' metadata but is plain XLA loops.
_SPLASH_RE = re.compile(r'^\s*(?:ROOT )?%?(splash_mha_(?:fwd|dq|dkv)[a-z_]*[a-z])[.\d]* = .*tpu_custom_call', re.M)


@dataclasses.dataclass
class FitReport:
  target: str
  device_kind: str
  num_devices: int
  mesh: dict[str, int]
  global_batch: int
  seq_len: int
  grad_accum: int
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  device_memory_bytes: int
  headroom: float
  model_flops_per_step: float  # 6N + attention convention, whole step, all devices
  xla_flops_per_device: float | None  # XLA's own count (TPU/CPU; None on the GPU compile-only target)
  peak_flops_per_device: float
  attention_kernels: list[str]
  compile_seconds: float
  notes: list[str] = dataclasses.field(default_factory=list)
  compiler_refused: bool = False  # the compiler stopped at the memory limit: only temporaries are known
  # Multi-slice / multi-node (aot/collectives.py): what crosses the data-centre network, per device per step.
  granules: int = 1  # slices (TPU) or nodes (GPU) the mesh spans
  dcn: dict[str, int] = dataclasses.field(default_factory=dict)  # the config's mesh.dcn_* sizes
  dcn_collectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # collectives.by_kind
  dcn_bandwidth: float | None = None  # bytes/s per device (neobert_jax/hardware.py), None if not published
  # The roofline of the compiled program (aot/roofline.py): its summary and the lines the report prints.
  roofline: dict[str, Any] | None = None
  roofline_lines: list[str] = dataclasses.field(default_factory=list)
  # XLA's TPU cost model for the step (aot/plan.tpu_seconds; compile --cost_model), with the MFU it prices splash at.
  cost_model_seconds: float | None = None
  cost_model_splash_mfu: float | None = None

  @property
  def total_bytes(self) -> int:
    return resident_bytes(vars(self))

  @property
  def fits(self) -> bool:
    return not self.compiler_refused and self.total_bytes <= self.headroom * self.device_memory_bytes

  @property
  def uses_cudnn_attention(self) -> bool:
    return any(k.startswith('__cudnn$fmha') for k in self.attention_kernels)

  def step_seconds_at(self, mfu: float) -> float:
    """Step time if the devices reach `mfu` of their peak on the model FLOPs."""
    return self.model_flops_per_step / (self.num_devices * self.peak_flops_per_device * mfu)

  @property
  def dcn_bytes_per_step(self) -> float:
    return sum(row['bytes'] for row in self.dcn_collectives.values())

  @property
  def dcn_seconds(self) -> float | None:
    """Time to send the DCN bytes at the published bandwidth, with nothing overlapped (an upper bound)."""
    return self.dcn_bytes_per_step / self.dcn_bandwidth if self.dcn_bandwidth else None

  @property
  def fsdp_gathers_cross_dcn(self) -> bool:
    return 'all-gather' in self.dcn_collectives

  def as_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d.pop('roofline_lines')
    d.update(
      total_bytes=self.total_bytes,
      fits=self.fits,
      uses_cudnn_attention=self.uses_cudnn_attention,
      tokens_per_step=self.global_batch * self.seq_len,
      step_seconds_at_50pct_mfu=self.step_seconds_at(0.5),
      dcn_bytes_per_step=self.dcn_bytes_per_step,
      dcn_seconds=self.dcn_seconds,
      fsdp_gathers_cross_dcn=self.fsdp_gathers_cross_dcn,
    )
    return d


def memory_numbers(compiled: Any) -> dict[str, int]:
  stats = compiled.memory_analysis()
  if stats is None:
    raise RuntimeError('this backend gives no memory analysis for the compiled step')
  return dict(
    argument_bytes=int(stats.argument_size_in_bytes),
    output_bytes=int(stats.output_size_in_bytes),
    alias_bytes=int(stats.alias_size_in_bytes),
    temp_bytes=int(stats.temp_size_in_bytes),
    code_bytes=int(stats.generated_code_size_in_bytes),
  )


def resident_bytes(mem: dict[str, int]) -> int:
  """The peak the step needs resident (module docstring), from memory_numbers' fields."""
  return mem['argument_bytes'] + mem['output_bytes'] - mem['alias_bytes'] + mem['temp_bytes'] + mem['code_bytes']


def cost_analysis(compiled: Any) -> dict[str, Any]:
  """XLA's cost analysis of one device's program; empty where the backend gives none."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001 - the GPU compile-only client raises or returns None
    return {}
  if isinstance(cost, (list, tuple)):  # older jax returned one dict per program
    cost = cost[0] if cost else None
  return cost or {}


def xla_flops(compiled: Any) -> float | None:
  """XLA's FLOP count for one device's program, or None where the backend does not provide it."""
  cost = cost_analysis(compiled)
  return float(cost['flops']) if 'flops' in cost else None


def attention_kernels(hlo_text: str) -> list[str]:
  """Distinct fused-attention kernels (cuDNN custom-call targets, Pallas splash) in the HLO."""
  return sorted(set(_CUDNN_RE.findall(hlo_text)) | set(_SPLASH_RE.findall(hlo_text)))


_UNITS = {'': 1, 'K': 1024, 'M': 1024**2, 'G': 1024**3, 'T': 1024**4}
# libtpu: "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries
# (27.44G) exceeds available HBM (15.75G)."  and the older "Used 27.44G of 15.75G hbm" wording.
_OOM_RES = (
  re.compile(r'required for HLO temporaries \(([\d.]+)([KMGT]?)'),
  re.compile(r'Used ([\d.]+)([KMGT]?) of [\d.]+[KMGT]? hbm'),
)


def parse_oom(message: str) -> int | None:
  """Bytes the compiler said the program needs, if `message` is an out-of-memory refusal; else None."""
  if 'RESOURCE_EXHAUSTED' not in message and 'Ran out of memory' not in message:
    return None
  for pattern in _OOM_RES:
    m = pattern.search(message)
    if m:
      return int(float(m.group(1)) * _UNITS[m.group(2)])
  return None


def compile_or_oom(lowered: Any) -> tuple[Any, Exception | None]:
  """(the compiled program, None) or, when the compiler refuses it for memory (TPU: over HBM), (None, the refusal):
  the answer "does not fit", not an error."""
  try:
    return lowered.compile(), None
  except Exception as e:  # noqa: BLE001 - only the compiler's out-of-memory verdict is a report
    if parse_oom(str(e)) is None:
      raise
    return None, e


def _gib(n: float) -> str:
  """Bytes in GiB, or MiB below 1 GiB (toy configs would otherwise print 0.00 everywhere)."""
  if abs(n) < 1024**3:
    return f'{n / 1024**2:8.1f} MiB'
  return f'{n / 1024**3:8.2f} GiB'


def _flops(n: float) -> str:
  return f'{n / 1e12:.2f} TFLOP' if n >= 1e11 else f'{n / 1e9:.3f} GFLOP'


def format_report(r: FitReport) -> str:
  mesh = ' x '.join(f'{k}={v}' for k, v in r.mesh.items())
  lines = [
    f'target        {r.target}: {r.num_devices} x {r.device_kind}',
    f'mesh          {mesh}',
    f'batch         {r.global_batch} sequences x {r.seq_len} tokens = {r.global_batch * r.seq_len:,} tokens/step'
    + (f' ({r.grad_accum} micro-batches)' if r.grad_accum > 1 else ''),
    'memory per device:'
    + (' (compile stopped at the memory limit; only the temporaries are known)' if r.compiler_refused else ''),
    f'  arguments   {_gib(r.argument_bytes)}',
    f'  outputs     {_gib(r.output_bytes)}  (aliased with donated arguments: {_gib(r.alias_bytes).strip()})',
    f'  temporaries {_gib(r.temp_bytes)}',
    f'  code        {_gib(r.code_bytes)}',
    f'  total       {_gib(r.total_bytes)}  of {_gib(r.device_memory_bytes).strip()} '
    f'({100 * r.total_bytes / r.device_memory_bytes:.1f}%)',
    f'fits          {"YES" if r.fits else "NO"} (limit {int(100 * r.headroom)}% of device memory)',
    f'model FLOPs   {_flops(r.model_flops_per_step)}/step '
    f'({_flops(r.model_flops_per_step / r.num_devices)} per device; 6 x matmul params + attention, per token)',
  ]
  if r.xla_flops_per_device is not None:
    lines.append(
      f'XLA FLOPs     {_flops(r.xla_flops_per_device)}/step per device (XLA cost analysis of the partitioned program)'
    )
  lines.append(
    f'step time     {r.step_seconds_at(0.5) * 1e3:.3g} ms at 50% MFU '
    f'({r.peak_flops_per_device / 1e12:.0f} TFLOP/s peak per device)'
  )
  if r.cost_model_seconds:
    mfu = r.step_seconds_at(1.0) / r.cost_model_seconds  # the step at full MFU over the estimated step
    lines.append(
      f'cost model    {r.cost_model_seconds * 1e3:,.1f} ms/step, est. MFU {mfu:.1%} (XLA TPU cost model of 1- and '
      f'2-layer micro-batch programs, extrapolated; splash at {r.cost_model_splash_mfu:.0%} MFU)'
    )
  for prefix, what in (('__cudnn', 'cuDNN fused'), ('splash', 'Pallas splash')):
    if names := [k for k in r.attention_kernels if k.startswith(prefix)]:
      lines.append(f'attention     {what}: {", ".join(names)}')
  if not r.attention_kernels:
    lines.append('attention     XLA (no fused attention kernel in the compiled program)')
  lines += dcn_lines(r)
  lines += r.roofline_lines
  lines.append(f'compile       {r.compile_seconds:.1f} s')
  lines += [f'note          {n}' for n in r.notes]
  return '\n'.join(lines)


def dcn_lines(r: FitReport) -> list[str]:
  """The report's data-centre network section (nothing for a single slice / node)."""
  if r.granules < 2:
    return []
  set_ = ' '.join(f'mesh.{k}={v}' for k, v in r.dcn.items()) or 'mesh.dcn_* unset'
  head = f'DCN           {r.granules} slices / nodes ({set_})'
  if not r.dcn_collectives:
    return [head + ': no collective crosses the DCN']
  lines = [head + '; collectives crossing it, per device per step:']
  for kind, row in r.dcn_collectives.items():
    runs = f'{int(row["ops"])} ops, {int(row["per_step"])} runs/step'
    lines.append(f'  {kind:20s}{runs:26s}{_gib(row["bytes"])}')
  total = f'  {"total":46s}{_gib(r.dcn_bytes_per_step)}'
  if r.dcn_seconds is not None:
    total += (
      f'  -> {r.dcn_seconds * 1e3:.3g} ms/step at {r.dcn_bandwidth / 1e9:.3g} GB/s per device '
      '(neobert_jax/hardware.py; nothing overlapped)'
    )
  else:
    total += '  (no published DCN bandwidth for this device: no time estimate)'
  lines.append(total)
  if r.fsdp_gathers_cross_dcn:
    if r.dcn.get('dcn_fsdp', 1) > 1:
      where = 'mesh.dcn_fsdp > 1 spreads FSDP over slices / nodes'
    elif all(v == 1 for v in r.dcn.values()):
      where = 'the devices span slices / nodes but mesh.dcn_* are all 1, so the mesh ignores the boundary'
    else:
      where = 'an all-gather spans slices / nodes'
    gathered = _gib(r.dcn_collectives['all-gather']['bytes']).strip()
    lines.append(
      f"warning       FSDP's parameter all-gathers cross the DCN ({gathered} per device per step): {where}; "
      'set mesh.dcn_data to the number of slices / nodes and keep fsdp inside each'
    )
  return lines


def dcn_fields(hlo: str, mesh: Any, mesh_config: Any, target: Any) -> dict[str, Any]:
  """The FitReport fields of the DCN section, for a program compiled on `mesh` for `target`."""
  from neobert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from neobert_jax.aot import collectives  # pylint: disable=g-import-not-at-top

  layout = shd.resolve_layout(dict(mesh_config), mesh.size)
  granules, transfers = collectives.for_mesh(hlo, mesh, layout) if hlo else (target.num_granules, [])
  return dict(
    granules=granules,
    dcn={f: int(mesh_config[f]) for f in shd.DCN_FIELDS.values() if f in mesh_config},
    dcn_collectives=collectives.by_kind(transfers),
    dcn_bandwidth=target.dcn_bandwidth,
  )
