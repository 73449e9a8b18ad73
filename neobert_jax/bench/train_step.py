"""Train-step throughput on this machine: the JAX trainer vs the project's PyTorch NeoBERT, same config, same run.

python -m neobert_jax.bench.train_step [--layers 4 --hidden 768 --heads 12 --seq 512 --batch 4 --steps 5]
                                       [--attention xla blockwise]

Both sides train the same model (weights copied from the JAX init) with AdamW (0.9, 0.95, eps 1e-8, wd 0.1) and
global-norm clipping at 1.0 on the same batches: 20% of the tokens carry the MLM loss. The JAX step is the real
one from neobert_jax.train (sparse head: only masked positions are decoded); PyTorch runs the HF-layout model
eagerly and computes all logits, like the original NeoBERT code. Steps alternate between the two sides so machine
load hits both alike. Achieved FLOP/s credit each side with the work it does (neobert_jax.model.config.
train_flops_per_token: full decoder for PyTorch, decoder at the masked fraction for JAX) and are compared with the
best square matmul each framework reaches here. With several --attention kernels, each runs as its own JAX side
in the same interleaved loop (the same weights and batches), so kernels are compared side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import jax
import numpy as np
from flax import nnx

from neobert_jax import sharding as shd
from neobert_jax.model import to_flat
from neobert_jax.model.config import train_flops_per_token
from neobert_jax.train import metrics as metrics_lib
from neobert_jax.train import state as state_lib
from neobert_jax.train import step as step_lib
from neobert_jax.train.testing import tiny_config


def _config(a: argparse.Namespace):
  cfg = tiny_config(vocab_size=30522, hidden=a.hidden, layers=a.layers, seq_len=a.seq, batch=a.batch)
  cfg.model.num_heads, cfg.model.intermediate_size = a.heads, 4 * a.hidden
  cfg.data.max_predictions = int(round(0.25 * a.seq))  # 20% masked on average, slots to spare
  cfg.train.compute_dtype = cfg.model.dtype = 'float32'
  cfg.optimizer.warmup_steps, cfg.train.num_steps = 0, 1000
  return cfg


def _batches(cfg, n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
  """Full rows (no padding), 20% of positions chosen for the loss; both frameworks get the same rows."""
  rng = np.random.default_rng(seed)
  b, t, p = cfg.train.global_batch_size, cfg.model.max_length, cfg.data.max_predictions
  out = []
  for _ in range(n):
    ids = rng.integers(1000, cfg.model.vocab_size, (b, t)).astype(np.int32)
    chosen = rng.random((b, t)) < 0.2
    pos = np.zeros((b, p), np.int32)
    w = np.zeros((b, p), np.float32)
    for r in range(b):
      idx = np.flatnonzero(chosen[r])[:p]
      pos[r, :len(idx)], w[r, :len(idx)] = idx, 1.0
    labels = np.where(chosen, ids, -100).astype(np.int32)
    masked = np.where(chosen, 103, ids).astype(np.int32)
    out.append({'input_ids': masked, 'positions': np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
                'segment_ids': np.ones((b, t), np.int32), 'labels': labels, 'mlm_positions': pos,
                'mlm_labels': np.take_along_axis(ids, pos, 1), 'mlm_weights': w})
  return out


def jax_stepper(cfg, batches) -> tuple[Callable[[int], None], dict]:
  """The real trainer step on one device; returns (run step i, the initial parameters as a flat dict)."""
  mesh = shd.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  defs, state = state_lib.create_train_state(cfg, mesh)
  flat = to_flat(nnx.merge(defs.model_def, state['params']))  # the project's flat layout, as the converter uses
  train = step_lib.build_train_step(cfg, mesh, defs)
  keys, sharding = step_lib.batch_keys(cfg), step_lib.batch_sharding(mesh)
  dev = [{k: jax.device_put(b[k][None], sharding) for k in keys} for b in batches]
  box = {'state': state}

  def run(i: int) -> None:
    box['state'], m = train(box['state'], dev[i % len(dev)])
    jax.block_until_ready(m)
  return run, flat


def torch_stepper(cfg, flat, batches) -> Callable[[int], None]:
  """Our PyTorch NeoBERT (HF layout, eager, logits for every token) with torch's AdamW and clipping."""
  import torch  # pylint: disable=g-import-not-at-top
  from neobert_jax.convert.torch_ref import torch_model_from_flat  # pylint: disable=g-import-not-at-top
  model = torch_model_from_flat(flat, cfg.model).train()
  decay = [p for n, p in model.named_parameters() if 'norm' not in n and not n.endswith('bias')]
  rest = [p for n, p in model.named_parameters() if 'norm' in n or n.endswith('bias')]
  o = cfg.optimizer
  opt = torch.optim.AdamW([{'params': decay, 'weight_decay': o.weight_decay}, {'params': rest, 'weight_decay': 0.0}],
                          lr=o.peak_lr, betas=(o.b1, o.b2), eps=o.eps)
  tb = [{k: torch.from_numpy(b[k]).long() for k in ('input_ids', 'labels')} for b in batches]

  def run(i: int) -> None:
    b = tb[i % len(tb)]
    opt.zero_grad(set_to_none=True)
    out = model(input_ids=b['input_ids'], attention_mask=torch.ones_like(b['input_ids']), labels=b['labels'])
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm)
    opt.step()
  return run


def interleaved_seconds(steppers: dict[str, Callable[[int], None]], steps: int, warmup: int = 2) -> dict:
  """Median step time of each side; steps alternate between sides so machine load hits them alike."""
  for i in range(warmup):  # compilation (JAX) and allocator warm-up (both)
    for run in steppers.values():
      run(i)
  times: dict[str, list[float]] = {name: [] for name in steppers}
  for i in range(steps):
    for name, run in steppers.items():
      start = time.perf_counter()
      run(warmup + i)
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def torch_matmul_peak(n: int = 2048, seconds: float = 1.0) -> float:
  import torch  # pylint: disable=g-import-not-at-top
  a = torch.ones(n, n)
  a @ a
  reps, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds or reps < 3:
    a @ a
    reps += 1
  return 2 * n ** 3 * reps / (time.perf_counter() - start)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--layers', type=int, default=4)
  p.add_argument('--hidden', type=int, default=768)
  p.add_argument('--heads', type=int, default=12)
  p.add_argument('--seq', type=int, default=512)
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--steps', type=int, default=5)
  p.add_argument('--skip-torch', action='store_true')
  p.add_argument('--attention', nargs='+', default=['auto'],
                 help="model.attention_impl of each JAX side ('auto' = what the trainer picks on this backend)")
  a = p.parse_args()
  cfg = _config(a)
  tokens = a.batch * a.seq
  batches = _batches(cfg, 4)
  masked = float(np.mean([b['mlm_weights'].sum() for b in batches])) / tokens
  # Each side is credited with the work it must do: PyTorch decodes every token, the JAX step only masked ones.
  flops_full = train_flops_per_token(cfg.model, a.seq)
  flops_sparse = train_flops_per_token(cfg.model, a.seq, decoder_fraction=masked)
  peak_xla = max(metrics_lib.measure_matmul_peak(n) for n in (1024, 2048))
  steppers, flat = {}, None
  for kernel in a.attention:
    c = cfg.copy_and_resolve_references()
    c.model.attention_impl = kernel
    steppers[f'jax-{kernel}'], flat = jax_stepper(c, batches)  # same seed: the same initial weights
  if not a.skip_torch:
    peak_torch = torch_matmul_peak()
    steppers['torch'] = torch_stepper(cfg, flat, batches)
  sec = interleaved_seconds(steppers, a.steps)
  best_peak = max(peak_xla, peak_torch) if not a.skip_torch else peak_xla
  res = {'config': vars(a), 'tokens_per_step': tokens, 'masked_fraction': masked, 'xla_matmul_peak_flops': peak_xla}
  for kernel in a.attention:
    s = sec[f'jax-{kernel}']
    res[f'jax-{kernel}'] = {'step_s': s, 'tokens_per_s': tokens / s, 'model_flops': flops_sparse * tokens / s,
                            'frac_of_best_peak': flops_sparse * tokens / s / best_peak}
    if not a.skip_torch:
      res[f'jax-{kernel}']['speedup_vs_torch'] = sec['torch'] / s
  if not a.skip_torch:
    res['torch'] = {'matmul_peak_flops': peak_torch, 'step_s': sec['torch'], 'tokens_per_s': tokens / sec['torch'],
                    'model_flops': flops_full * tokens / sec['torch'],
                    'frac_of_best_peak': flops_full * tokens / sec['torch'] / best_peak}
  print(json.dumps(res, indent=2))


if __name__ == '__main__':
  main()
