"""Recipe planning for a target: compile the candidate layouts of one global batch (docs/performance.md, "Which
layout is fastest?"), recommend the fastest that fits.

Estimated step (a model): GPU, the roofline of the compiled step; TPU, XLA's cost model (`optimal_seconds`) of 1-
and 2-layer unrolled micro-batch programs extrapolated to the depth (loop bodies are costed once), times the
accumulation steps, plus splash attention's FLOPs at the stated MFU (a custom call the cost model does not see) and
on several slices the DCN bytes at the published bandwidth. Not the optimizer.

Candidates compile in spawned processes (a forked jax runtime is not safe to use); results are cached on disk under
the resolved config, the target, what was compiled and the package's source and jax's version."""

import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from neobert_jax import config as config_lib
from neobert_jax import paths
from neobert_jax.aot import report, targets


@dataclasses.dataclass
class Row:
  mesh: dict[str, int]
  remat: str
  micro_per_device: int
  grad_accum: int
  fits: bool
  total_bytes: int
  seconds: float | None
  kernels: list[str]
  note: str = ''
  dcn_bytes: float = 0.0  # per device per step across slices / nodes
  dcn_seconds: float | None = None
  fsdp_gathers_cross_dcn: bool = False
  roofline_seconds: float | None = None  # the roofline of the compiled step (on TPU beside the cost model)
  roofline_mfu: float | None = None
  other_share: float | None = None  # share of the roofline step outside matmuls and attention

  def overrides(self) -> list[str]:
    mesh = [f'--config.mesh.{k}={v}' for k, v in self.mesh.items()]
    return mesh + [f'--config.train.grad_accum_steps={self.grad_accum}', f'--config.model.remat_policy={self.remat}']


def meshes(
  num_devices: int,
  num_heads: int,
  tensor_sizes: tuple[int, ...],
  layouts: tuple[str, ...] = ('fsdp', 'data'),
  granules: int = 1,
) -> list[dict[str, int]]:
  """Candidate mesh sections; with granules > 1 slices / nodes, sizes are per slice plus the dcn_* fields."""
  out = []
  per = num_devices // granules
  # with several slices: replicas across them, FSDP inside (gradients cross once) / FSDP across everything
  over = ({'dcn_data': granules, 'dcn_fsdp': 1}, {'dcn_data': 1, 'dcn_fsdp': granules}) if granules > 1 else ({},)
  for t in tensor_sizes:
    if per % t or num_heads % t:
      continue
    rest = per // t
    if 'fsdp' in layouts:
      out += [{'data': 1, 'fsdp': rest, 'tensor': t} | o for o in over]
    if 'data' in layouts and (rest > 1 or 'fsdp' not in layouts):
      out.append({'data': rest, 'fsdp': 1, 'tensor': t} | over[0])
  return out


def _with(cfg, mesh: dict[str, int], remat: str, accum: int):
  fields = {f'mesh.{k}': v for k, v in {'dcn_data': 1, 'dcn_fsdp': 1, **mesh}.items()}
  return config_lib.replace(cfg, {**fields, 'model.remat_policy': remat, 'train.grad_accum_steps': accum})


def compile_layout(cfg, target: targets.Target, headroom: float) -> dict:
  """What the plan keeps of the full train step's report (JSON, cached and sent between processes)."""
  r = report.compile_report(cfg, target, 'train', headroom)[0]
  rl = r.roofline and {'seconds': r.roofline['step_seconds']} | {k: r.roofline[k] for k in ('mfu', 'other_share')}
  return dict(fits=r.fits, total=r.total_bytes, kernels=r.attention_kernels, dcn=r.dcn_collectives, roofline=rl)


@functools.cache
def source_fingerprint() -> str:
  """The package's Python source and jax's version: anything that changes the compiled program."""
  import jax  # pylint: disable=g-import-not-at-top

  h = hashlib.sha256(jax.__version__.encode())
  root = Path(__file__).resolve().parents[1]
  for f in sorted(root.rglob('*.py')):
    h.update(str(f.relative_to(root)).encode())
    h.update(f.read_bytes())
  return h.hexdigest()[:16]


def cached(cfg, target: targets.Target, what: tuple, compute: Callable[[], Any]) -> tuple[Any, bool]:
  """(compute()'s JSON-able result, whether it came from the cache)."""
  text = json.dumps([cfg.to_json_best_effort(sort_keys=True), target.spec, list(what), source_fingerprint()])
  path = paths.cache_dir('plan') / f'{hashlib.sha256(text.encode()).hexdigest()[:24]}.json'
  if path.exists():
    try:
      return json.loads(path.read_text())['result'], True
    except (ValueError, KeyError):
      pass  # a damaged entry is computed again
  result = compute()
  # all or nothing: parallel planners may write the same entry
  paths.write_text(path, json.dumps({'target': target.spec, 'what': list(what), 'result': result}))
  return result, False


def tpu_seconds(cfg, target: targets.Target, mfu: float) -> float | None:
  """XLA's cost model, extrapolated from 1- and 2-layer unrolled micro-batch programs (module docstring)."""
  costs = []
  for layers in (1, 2):
    c = config_lib.replace(cfg, {'model.num_layers': layers, 'model.scan_layers': False})
    cost = report.cost_analysis(report.lower_step(c, target, 'forward_backward')[0].compile())
    if 'optimal_seconds' not in cost:
      return None
    costs.append(float(cost['optimal_seconds']))
  micro = costs[0] + (cfg.model.num_layers - 1) * (costs[1] - costs[0])
  seconds = micro * cfg.train.grad_accum_steps
  if cfg.model.attention_impl == 'splash':  # a custom call: invisible to the cost model, so add its FLOPs
    t = cfg.model.max_length
    attention = 12 * cfg.model.num_layers * t * cfg.model.hidden_size * cfg.train.global_batch_size * t
    seconds += attention / (target.num_devices * target.peak_bf16_flops * mfu)
  return seconds


def roofline_seconds(result: dict) -> float | None:
  """The roofline step of one compile_layout result, None where it did not fit or has no roofline."""
  return (result['roofline'] or {}).get('seconds') if result['fits'] else None


def fastest_fitting(tried: dict[int, dict], default: int) -> int:
  """The fitting micro-batch size of shortest roofline step (ties, no roofline: the larger); `default` if none fits."""
  fitting = [k for k, v in tried.items() if v['fits']]
  return min(fitting, key=lambda k: (roofline_seconds(tried[k]) or math.inf, -k), default=default)


def search(cfg, target: targets.Target, mesh: dict[str, int], remat: str, headroom: float, mfu: float) -> Row:
  """For one (mesh, remat): the largest micro-batch that fits (binary search), then of the sizes compiled the
  one the roofline prices fastest (near the memory limit XLA rematerialises on its own)."""
  global_batch = cfg.train.global_batch_size
  # devices the batch is split over: data x fsdp in total (per-slice size x slices spanned)
  shards = mesh['data'] * mesh.get('dcn_data', 1) * mesh['fsdp'] * mesh.get('dcn_fsdp', 1)
  micro_sizes = [
    m for m in (2**i for i in range(20)) if m * shards <= global_batch and global_batch % (m * shards) == 0
  ]
  lo, hi, tried = 0, len(micro_sizes) - 1, {}
  while lo <= hi:  # the largest micro-batch that fits
    mid = (lo + hi) // 2
    m = micro_sizes[mid]
    c = _with(cfg, mesh, remat, global_batch // (m * shards))
    t0 = time.time()
    tried[m], hit = cached(c, target, ('train', headroom), lambda: compile_layout(c, target, headroom))
    seconds = roofline_seconds(tried[m])
    print(
      f'[plan] mesh {mesh} remat {remat:9s} micro {m:4d}/device: {tried[m]["total"] / 2**30:7.2f} GiB '
      f'{"fits" if tried[m]["fits"] else "too big"}{f", roofline {seconds * 1e3:,.1f} ms" if seconds else ""} '
      f'({"cached" if hit else f"{time.time() - t0:.0f} s"})',
      file=sys.stderr,
      flush=True,
    )
    if tried[m]['fits']:
      lo = mid + 1
    else:
      hi = mid - 1
  m = fastest_fitting(tried, default=micro_sizes[0])
  r = tried[m]
  c = _with(cfg, mesh, remat, global_batch // (m * shards))
  dcn_bytes = sum(row['bytes'] for row in r['dcn'].values())
  dcn_seconds = dcn_bytes / target.dcn_bandwidth if dcn_bytes and target.dcn_bandwidth else None
  seconds, note, rl = None, '', r['roofline'] or {}
  if r['fits'] and target.platform == 'tpu':
    seconds = cached(c, target, ('tpu_cost', mfu), lambda: tpu_seconds(c, target, mfu))[0]
    note = 'TPU cost model' if seconds is not None else 'no cost model'
    if seconds is not None and dcn_seconds is not None:
      seconds += dcn_seconds
  elif r['fits']:
    seconds, note = rl.get('seconds'), 'roofline'
  return Row(
    mesh,
    remat,
    m,
    c.train.grad_accum_steps,
    r['fits'],
    r['total'],
    seconds,
    r['kernels'],
    note,
    dcn_bytes,
    dcn_seconds,
    'all-gather' in r['dcn'],
    *(rl.get(k) for k in ('seconds', 'mfu', 'other_share')),
  )


def plan_layouts(
  cfg,
  target: targets.Target,
  *,
  mfu: float,
  headroom: float,
  remats: tuple[str, ...],
  tensor_sizes: tuple[int, ...],
  layouts: tuple[str, ...],
  workers: int,
) -> list[Row]:
  """search() for every candidate (mesh, remat), in `workers` processes (0: one per two cores, as XLA's compiler
  uses more than one thread and each process holds a backend)."""
  tasks = [
    (cfg, target, mesh, remat, headroom, mfu)
    for mesh in meshes(target.num_devices, cfg.model.num_heads, tensor_sizes, layouts, target.num_granules)
    for remat in remats
  ]
  workers = min(workers or max(1, (os.cpu_count() or 1) // 2), len(tasks))
  if workers <= 1:
    return [search(*task) for task in tasks]
  with concurrent.futures.ProcessPoolExecutor(
    workers, mp_context=multiprocessing.get_context('spawn'), initializer=targets.start_backends, initargs=(target,)
  ) as pool:
    return list(pool.map(search, *zip(*tasks)))


def recommend(rows: list[Row]) -> Row | None:
  if not (ok := [r for r in rows if r.fits and r.seconds is not None]):
    return None
  # equal to 6 significant digits is a tie (layouts whose estimate differs only in float noise)
  return min(ok, key=lambda r: (float(f'{r.seconds:.6g}'), r.grad_accum, r.total_bytes))


def format_plan_table(rows: list[Row], target: targets.Target) -> str:
  basis = 'roofline of the compiled step'
  if target.platform == 'tpu':
    basis = 'XLA TPU cost model (+ splash attention FLOPs at MFU)'
  multi = target.num_granules > 1
  if multi:
    basis += ' + DCN bytes at the published bandwidth'
  head = (
    f'| mesh (data x fsdp x tensor{", per slice; dcn data x fsdp" if multi else ""}) | remat | '
    f'micro-batch / device | accum | memory / device | fits | attention kernel |'
    f'{" DCN / device / step |" if multi else ""} est. step ({basis}) | roofline: step, MFU, outside '
    'matmul / attention |'
  )
  lines = [head, '|' + '---|' * (10 if multi else 9)]
  for r in rows:
    mesh = f'{r.mesh["data"]} x {r.mesh["fsdp"]} x {r.mesh["tensor"]}'
    if multi:
      mesh += f'; {r.mesh["dcn_data"]} x {r.mesh["dcn_fsdp"]}'
    names = {k.replace('__cudnn$', '').replace('Backward', '').split('_segmented')[0] for k in r.kernels}
    kern = ', '.join(sorted(names)) or 'XLA'
    est = f'{r.seconds * 1e3:,.4g} ms' if r.seconds is not None else '-'
    rl = '-'
    if r.roofline_seconds is not None:
      rl = f'{r.roofline_seconds * 1e3:,.4g} ms, {r.roofline_mfu:.1%}, {r.other_share:.1%}'
    dcn = ''
    if multi:
      dcn = f' {r.dcn_bytes / 2**20:,.3g} MiB' + (f' ({r.dcn_seconds * 1e3:,.3g} ms)' if r.dcn_seconds else '') + ' |'
    lines.append(
      f'| {mesh} | {r.remat} | {r.micro_per_device} | {r.grad_accum} | {r.total_bytes / 2**30:.2f} GiB '
      f'| {"yes" if r.fits else "no"} | {kern} |{dcn} {est} | {rl} |'
    )
  for r in rows:
    if r.fsdp_gathers_cross_dcn:
      lines.append(
        f"warning: mesh {r.mesh} (remat {r.remat}): FSDP's all-gathers cross the DCN; with "
        'mesh.dcn_data carrying the slices / nodes they stay inside each'
      )
  return '\n'.join(lines)
