"""The trainer's step compiled for a target (aot/targets.py), and what the executable tells, per device: memory,
whether it fits, FLOPs, the attention kernels, what crosses the data-centre network (aot/collectives.py) and the
roofline (aot/roofline.py).

Memory is XLA's buffer assignment: total = arguments + outputs - aliased (the donated state) + temporaries + code.
'fits' compares it with headroom x device memory: the runtime keeps some memory for itself."""

import dataclasses
import re
import time
from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax import errors, hardware
from neobert_jax import sharding as shd
from neobert_jax.aot import collectives, roofline, targets
from neobert_jax.aot import hlo as hlo_lib
from neobert_jax.config import train as train_config
from neobert_jax.model.sizes import matmul_params, train_flops_per_token
from neobert_jax.train import mlm

# cuDNN fused attention custom calls (forward + backward; Softmax = padding/no mask, ScaleBias = boolean mask).
_CUDNN_RE = re.compile(r'__cudnn\$fmha\w+')
# Pallas kernels keep their name in the compiled TPU program: the Mosaic custom call is named after the kernel
# (%splash_mha_fwd_segmented_residuals.1 = ... custom_call_target="tpu_custom_call"). Only such calls count: an
# interpret-mode emulation carries the same names in its ops' metadata but is plain XLA loops.
_SPLASH_RE = re.compile(r'^\s*(?:ROOT )?%?(splash_mha_(?:fwd|dq|dkv)[a-z_]*[a-z])[.\d]* = .*tpu_custom_call', re.M)
_UNITS = {'': 1, 'K': 1024, 'M': 1024**2, 'G': 1024**3, 'T': 1024**4}
# libtpu: "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries
# (27.44G) exceeds available HBM (15.75G)."  and the older "Used 27.44G of 15.75G hbm" wording.
_OOM_RES = (
  re.compile(r'required for HLO temporaries \(([\d.]+)([KMGT]?)'),
  re.compile(r'Used ([\d.]+)([KMGT]?) of [\d.]+[KMGT]? hbm'),
)
# FitReport's memory fields: the memory_analysis() attribute each is read from
_MEMORY = {f'{k}_bytes': f'{k}_size_in_bytes' for k in ('argument', 'output', 'alias', 'temp')}
_MEMORY['code_bytes'] = 'generated_code_size_in_bytes'


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
  # What crosses the data-centre network, per device per step (collectives.by_kind), between the slices (TPU) or
  # nodes (GPU) the mesh spans; the config's mesh.dcn_* sizes; the bandwidth of hardware.py, None if not published.
  granules: int = 1
  dcn: dict[str, int] = dataclasses.field(default_factory=dict)
  dcn_collectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  dcn_bandwidth: float | None = None
  roofline: dict[str, Any] | None = None  # Roofline.as_dict()
  roofline_lines: list[str] = dataclasses.field(default_factory=list)
  # XLA's TPU cost model for the step (aot/plan.tpu_seconds; compile --cost_model), with the MFU it prices splash at.
  cost_model_seconds: float | None = None
  cost_model_splash_mfu: float | None = None

  @property
  def total_bytes(self) -> int:
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

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
      fsdp_gathers_cross_dcn='all-gather' in self.dcn_collectives,
    )
    return d


def lower_step(cfg, target: targets.Target, what: str = 'train'):
  """(lowered, mesh) of `what` (as --what) on the target's compile-only mesh; ConfigError where the trainer refuses."""
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
  packed, limit = cfg.data.packing == 'packed', mlm.max_segments(cfg.data)
  micro = {
    k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype, sharding=NamedSharding(mesh, P(*v.sharding.spec[1:])))
    for k, v in batch.items()
  }

  def loss(params, micro):
    total, (count, _) = mlm.mlm_sums(nnx.merge(defs.model_def, params), micro, packed, limit)
    return total / jax.numpy.maximum(count, 1.0)

  fn = jax.jit(
    jax.value_and_grad(loss),
    in_shardings=(defs.shardings['params'], {k: v.sharding for k, v in micro.items()}),
    out_shardings=(NamedSharding(mesh, P()), defs.shardings['params']),
  )
  with shd.activate(mesh):
    return fn.lower(abstract_state['params'], micro), mesh


def compile_report(cfg, target: targets.Target, what: str = 'train', headroom: float = 0.9) -> tuple[FitReport, str]:
  """(report, compiled HLO text) of lower_step's program; the text is '' where the compiler refused it for memory."""
  t0 = time.time()
  lowered, mesh = lower_step(cfg, target, what)
  try:
    compiled, refused = lowered.compile(), None
  except Exception as e:  # noqa: BLE001 - only the compiler's out-of-memory verdict (TPU: over HBM) is a report
    if parse_oom(str(e)) is None:
      raise
    compiled, refused = None, e
  seconds, text, notes = time.time() - t0, '', []
  seq, n = cfg.model.max_length, target.num_devices
  tokens = cfg.train.global_batch_size * seq
  model_flops = mlm.flops_per_token(cfg) * tokens  # the trainer's own MFU accounting
  if compiled is None:
    notes.append('the compiler refused the program: ' + errors.one_line(refused, first=True)[:300])
    mem, xla_flops = dict.fromkeys(_MEMORY, 0) | {'temp_bytes': parse_oom(str(refused))}, None
  else:
    text, stats, xla_flops = compiled.as_text(), compiled.memory_analysis(), cost_analysis(compiled).get('flops')
    if stats is None:
      raise RuntimeError('this backend gives no memory analysis for the compiled step')
    mem = {field: int(getattr(stats, name)) for field, name in _MEMORY.items()}
  if target.platform == 'cuda':
    if cfg.model.attention_impl not in ('cudnn', 'cudnn_bias'):
      notes.append(f'attention_impl={cfg.model.attention_impl}: the cuDNN fused kernels were not requested')
    notes.append(
      'GPU compile-only target: no autotuning, so kernel choices and temporaries may differ a little '
      'on a live GPU; XLA gives no FLOP count here'
    )
  if xla_flops is not None and xla_flops < 0.5 * model_flops / n:
    notes.append(
      'XLA FLOPs count each loop body once (the layer scan, the micro-batch scan), so they are far '
      'below the real step; the model FLOPs are the figure to use'
    )
  mod = hlo_lib.Module(text)  # parsed once, for the DCN section and the roofline
  layout = shd.resolve_layout(dict(cfg.mesh), mesh.size)
  granules, transfers = collectives.for_mesh(mod, mesh, layout) if text else (target.num_granules, [])
  kind = mesh.devices.flat[0].device_kind
  rl, lines = None, []
  if text:
    acc = hardware.lookup(kind) or hardware.lookup(target.chip.name)
    floor = roofline.TPU_MIN_KERNEL_SECONDS if target.platform == 'tpu' else roofline.GPU_MIN_KERNEL_SECONDS
    rl = roofline.analyze(
      mod,
      acc,
      kind,
      num_devices=mesh.size,
      dcn=transfers,
      model_flops_per_device=model_flops / n,
      min_kernel_seconds=floor,
    )
    # The formula's attention term (total minus matmuls, both without decoder) beside what the kernels count: the
    # dot FLOPs must match the matmul term, the check that the roofline reads the program.
    attention = (train_flops_per_token(cfg.model, seq, 0.0) - 6 * matmul_params(cfg.model, 0.0)) * tokens
    lines = roofline.format_lines(rl, (model_flops - attention) / n, attention / n)
  r = FitReport(
    target=target.spec,
    device_kind=kind,
    num_devices=n,
    mesh=dict(zip(mesh.axis_names, (int(s) for s in mesh.devices.shape))),
    global_batch=cfg.train.global_batch_size,
    seq_len=seq,
    grad_accum=cfg.train.grad_accum_steps,
    **mem,
    device_memory_bytes=target.chip.memory_bytes,
    headroom=headroom,
    model_flops_per_step=model_flops,
    xla_flops_per_device=None if xla_flops is None else float(xla_flops),
    peak_flops_per_device=target.peak_bf16_flops,
    attention_kernels=attention_kernels(text),
    compile_seconds=seconds,
    notes=notes,
    compiler_refused=compiled is None,
    granules=granules,
    dcn={f: int(cfg.mesh[f]) for f in shd.DCN_FIELDS.values() if f in cfg.mesh},
    dcn_collectives=collectives.by_kind(transfers),
    dcn_bandwidth=target.dcn_bandwidth,
    roofline=rl and rl.as_dict(),
    roofline_lines=lines,
  )
  return r, text


def cost_analysis(compiled: Any) -> dict[str, Any]:
  """XLA's cost analysis of one device's program; empty where the backend gives none."""
  try:
    return compiled.cost_analysis() or {}
  except Exception:  # noqa: BLE001 - the GPU compile-only client raises or returns None
    return {}


def attention_kernels(hlo_text: str) -> list[str]:
  """Distinct fused-attention kernels (cuDNN custom-call targets, Pallas splash) in the HLO."""
  return sorted(set(_CUDNN_RE.findall(hlo_text)) | set(_SPLASH_RE.findall(hlo_text)))


def parse_oom(message: str) -> int | None:
  """Bytes the compiler said the program needs, if `message` is an out-of-memory refusal; else None."""
  if 'RESOURCE_EXHAUSTED' not in message and 'Ran out of memory' not in message:
    return None
  for pattern in _OOM_RES:
    if m := pattern.search(message):
      return int(float(m.group(1)) * _UNITS[m.group(2)])
  return None


def _gib(n: float) -> str:
  """Bytes in GiB, or MiB below 1 GiB (toy configs would otherwise print 0.00 everywhere)."""
  return f'{n / 1024**2:8.1f} MiB' if abs(n) < 1024**3 else f'{n / 1024**3:8.2f} GiB'


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
  lines += dcn_lines(r) + r.roofline_lines + [f'compile       {r.compile_seconds:.1f} s']
  return '\n'.join(lines + [f'note          {n}' for n in r.notes])


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
  if 'all-gather' in r.dcn_collectives:
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
