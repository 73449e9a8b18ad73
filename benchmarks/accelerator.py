"""One acceptance run for a lent accelerator (under 9 minutes on one H100); `--smoke` runs the same code at toy size
on CPU (CI runs it: tests/test_benchmark_accelerator.py).

  python -m benchmarks.accelerator --out DIR [--smoke]

Writes DIR/accelerator.json and DIR/accelerator.md:
  1. the `gpu`-marked tests (tests/test_model_attention_gpu.py: cuDNN packed, bias and padding kernels against XLA);
  2. the 250M train step at 1024 and 4096 on packed rows, one side per attention kernel that runs on this backend,
     side by side in one process with the project's PyTorch NeoBERT (bf16, SDPA, all logits, as the original code)
     on the same batches: tokens/s, MFU, peak memory (benchmarks/train_step.py's sides and interleaving);
  3. 200 real training steps of the 250M at 1024 on the built-in corpus (the trainer's own command);
  4. the roofline estimate of that same one-device program (aot/roofline.py on this backend's compiled step) next to
     the measured step time: the model's error, which is what the hardware table should be corrected by.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import train_step as bench
from neobert_jax import hardware
from neobert_jax.model.sizes import train_flops_per_token

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], timeout: float) -> dict:
  t0 = time.time()
  r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
  tail = (r.stdout + r.stderr).strip().splitlines()
  return {'cmd': ' '.join(cmd), 'rc': r.returncode, 'seconds': time.time() - t0, 'tail': tail[-12:]}


def _peak_memory() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


def _torch_bf16(cfg, flat, batches):
  """Our PyTorch NeoBERT in bf16 on this machine's GPU (SDPA inside), AdamW, all logits: the original's work."""
  import torch  # pylint: disable=g-import-not-at-top
  from neobert_jax.convert.torch_ref import torch_model_from_flat  # pylint: disable=g-import-not-at-top

  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  model = torch_model_from_flat(flat, cfg.model, dtype='bfloat16').to(device).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
  data = [{k: torch.from_numpy(np.asarray(b[k])).long().to(device) for k in ('input_ids', 'labels')} for b in batches]

  def run(i: int) -> float:
    opt.zero_grad(set_to_none=True)
    b = data[i % len(data)]
    loss = model(input_ids=b['input_ids'], attention_mask=torch.ones_like(b['input_ids']), labels=b['labels']).loss
    loss.backward()
    opt.step()
    return float(loss.detach())

  def peak() -> int | None:
    return torch.cuda.max_memory_allocated() if device == 'cuda' else None

  return run, peak


def step_comparison(a, seq: int) -> dict:
  """The train step at one sequence length, each kernel and PyTorch interleaved (train_step.interleaved)."""
  ns = argparse.Namespace(
    layers=a.layers, hidden=a.hidden, heads=a.heads, seq=seq, batch=a.rows * 1024 // seq, vocab=a.vocab, dtype='float32'
  )
  base = bench.make_config(ns, 'sparse')
  batches = [bench.mlm_rows(base, seed, bench.MASK_FRACTION) for seed in range(2)]
  tokens = ns.batch * seq
  masked = float(np.mean([b['mlm_weights'].sum() for b in batches])) / tokens
  kind = jax.devices()[0].device_kind
  peak = hardware.peak_flops(kind)
  kernels = ('cudnn', 'cudnn_bias', 'xla') if jax.default_backend() == 'gpu' else ('auto',)
  sides, work, memory, flat = {}, {}, {}, None
  for kernel in kernels:
    run, flat = bench.jax_side(bench.make_config(ns, 'sparse', kernel), 'step', batches)
    sides[f'jax-{kernel}'] = run
    work[f'jax-{kernel}'] = train_flops_per_token(base.model, seq, decoder_fraction=masked)
  torch_peak = None
  if a.torch:
    sides['torch-bf16-sdpa'], torch_peak = _torch_bf16(base, flat, batches)
    work['torch-bf16-sdpa'] = train_flops_per_token(base.model, seq, decoder_fraction=masked)
  seconds, losses = bench.interleaved(sides, a.steps, 2)
  out = {'seq': seq, 'rows': ns.batch, 'device': kind, 'sides': {}}
  for name, s in seconds.items():
    out['sides'][name] = {
      'step_s': s,
      'tokens_per_s': tokens / s,
      'mfu': work[name] * tokens / s / peak if peak else None,
      'first_loss': losses[name][0],
    }
  mem = _peak_memory()
  out['jax_peak_memory_bytes'] = mem  # all JAX sides of the process together
  out['torch_peak_memory_bytes'] = torch_peak() if torch_peak else None
  del memory
  return out


def roofline_of_training(a) -> dict | None:
  """The roofline of the one-device train step the training run compiles (this backend's own compiled program)."""
  code = (
    'import json,sys; from benchmarks.accelerator import _roofline_child as f; json.dump(f(sys.argv[1:]), sys.stdout)'
  )
  r = subprocess.run([sys.executable, '-c', code, *a.train_flags], capture_output=True, text=True, cwd=ROOT)
  return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {'error': r.stderr[-2000:]}


def _roofline_child(flags: list[str]) -> dict:
  from neobert_jax import config  # pylint: disable=g-import-not-at-top
  from neobert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from neobert_jax.aot import roofline  # pylint: disable=g-import-not-at-top

  cfg = config.load(flags[0].split('=', 1)[1])
  for f in flags[1:]:
    key, value = f[len('--config.') :].split('=', 1)
    section, field = key.split('.', 1)
    cfg[section][field] = type(cfg[section][field])(value)
  # the trainer's own resolution, state and step, through the modules benchmarks/train_step.py uses
  cfg, _ = bench.train_config.resolve_train(cfg)
  mesh = shd.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  defs, state = bench.mlm.abstract_train_state(cfg, mesh)
  step = bench.mlm.jit_mlm_train_step(cfg, mesh, defs)
  text = step.lower(state, bench.mlm.abstract_batch(cfg, mesh)).compile().as_text()
  flops = bench.mlm.flops_per_token(cfg) * cfg.train.global_batch_size * cfg.model.max_length
  kind = jax.devices()[0].device_kind
  acc = hardware.lookup(kind) or hardware.lookup('H100')
  rl = roofline.analyze(text, acc, kind, num_devices=1, model_flops_per_device=flops)
  return {
    'device': kind,
    'rates_of': acc.kind,
    'step_seconds': rl.step_seconds,
    'mfu': rl.mfu,
    'other_share': rl.other_share,
  }


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True)
  p.add_argument('--smoke', action='store_true', help='toy sizes (CPU, CI): the same code paths in under a minute')
  p.add_argument('--no-torch', dest='torch', action='store_false')
  a = p.parse_args()
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  if a.smoke:
    a.layers, a.hidden, a.heads, a.rows, a.steps, seqs, train_steps = 1, 64, 2, 1, 2, (128,), 3
    a.vocab = 2048  # tiny_cpu's: the vocabulary's size changes no code path, only the decoder's work
    # The trainer's command on the tiny recipe; its start-of-run evaluation and downstream probe are the main
    # job's (tests/test_scenario_main_job.py), not what this smoke proves.
    recipe, extra = 'configs/tiny_cpu.py', ['--config.eval.at_start=False', '--config.eval.probe_task=']
  else:
    a.layers, a.hidden, a.heads, a.rows, a.steps, seqs, train_steps = 28, 768, 12, 16, 10, (1024, 4096), 200
    a.vocab = 30522
    recipe, extra = (
      'configs/neobert_250m.py',
      ['--config.train.global_batch_size=16', '--config.train.grad_accum_steps=1', '--config.mesh.fsdp=1'],
    )
  a.train_flags = [
    f'--config={recipe}',
    f'--config.train.num_steps={train_steps}',
    f'--config.optimizer.warmup_steps={max(1, train_steps // 10)}',
    '--config.optimizer.warmup_fraction=0',
    *extra,
  ]
  res = {'smoke': a.smoke, 'backend': jax.default_backend(), 'device': jax.devices()[0].device_kind}
  res['gpu_tests'] = _run(
    [sys.executable, '-m', 'pytest', '-q', '-n', '0', '-m', 'gpu', 'tests/test_model_attention_gpu.py'], 300
  )
  res['train_step'] = [step_comparison(a, seq) for seq in seqs]
  env_flags = [*a.train_flags, f'--workdir={out / "train"}', '--config.checkpoint.every_steps=100000']
  res['training'] = _run([sys.executable, '-m', 'neobert_jax.train', *env_flags], 600)
  res['roofline'] = roofline_of_training(a)
  (out / 'accelerator.json').write_text(json.dumps(res, indent=2, default=str))
  (out / 'accelerator.md').write_text(markdown(res))
  print(markdown(res))


def markdown(res: dict) -> str:
  lines = [
    f'# Acceptance run on {res["device"]} ({res["backend"]}{", smoke" if res["smoke"] else ""})',
    '',
    f'gpu tests: rc {res["gpu_tests"]["rc"]} ({res["gpu_tests"]["tail"][-1] if res["gpu_tests"]["tail"] else ""})',
    '',
    '| seq | side | step s | tokens/s | MFU |',
    '|---|---|---|---|---|',
  ]
  for row in res['train_step']:
    for name, s in row['sides'].items():
      mfu = f'{s["mfu"]:.1%}' if s['mfu'] else '-'
      lines.append(f'| {row["seq"]} | {name} | {s["step_s"]:.4f} | {s["tokens_per_s"]:,.0f} | {mfu} |')
  rl, tr = res['roofline'] or {}, res['training']
  lines += [
    '',
    f'training: rc {tr["rc"]}, {tr["seconds"]:.0f} s; last lines: {tr["tail"][-1] if tr["tail"] else ""}',
    f'roofline of that step: {rl.get("step_seconds", float("nan")) * 1e3:.1f} ms estimated '
    f'(rates of {rl.get("rates_of")}), est. MFU {rl.get("mfu") or 0:.1%}; compare with the measured step above',
  ]
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  main()
