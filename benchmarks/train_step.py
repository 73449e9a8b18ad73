"""Train-step throughput on this machine: the JAX trainer, alone or against the project's PyTorch NeoBERT.

  python -m benchmarks.train_step [--layers 4 --hidden 768 --heads 12 --seq 512 --batch 4 --steps 5]
                                 [--mode step|grad] [--head sparse dense] [--attention xla blockwise] [--no-torch]
                                 [--optimizer adamw muon] [--vocab 30522] [--dtype float32]

The defaults are "bench-768" (4 layers x 768, 12 heads, vocab 30522, sequence 512, batch 4, fp32, 20% of the
tokens carrying the loss).
  --mode step   the full train step. JAX: the trainer's own jitted step (neobert_jax/train/step.py) with its
                optimizer (train/optimizer.py). PyTorch: torch's AdamW with the hyper-parameters of the same config
                section: betas, eps, weight decay and which parameters decay, clipping, the learning-rate schedule.
  --mode grad   forward + backward only: the trainer's loss and its gradients, no update.
  --head        `sparse` decodes only the masked positions (the trainer, data.max_predictions > 0); `dense`
                computes logits for every token (max_predictions = 0; the original NeoBERT's work). Give both to
                compare them.
  --attention   model.attention_impl of the JAX sides ('auto': what the trainer picks on this backend); each
                kernel is its own side, so kernels are compared side by side.
  --optimizer   optimizer.name of the JAX sides, each its own side (the PyTorch side is always AdamW).
  --vocab, --dtype  the vocabulary size and model.dtype (the main job: 2048, bfloat16).
Sides: JAX for each (kernel, head), PyTorch (eager, HF layout, the JAX init's weights) for each head unless
--no-torch; all train on the same batches. Steps alternate between the sides so machine load hits them alike, and
the median step is reported. Model FLOP/s credit each side with the work it does (train_flops_per_token at its
decoder fraction), compared with the best square matmul either framework reaches here.

A script, not part of the library (nothing imports it): run it from the repository root as above, or as
`python benchmarks/train_step.py` where the package is installed. It needs torch only for the PyTorch sides.
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
from neobert_jax.model.sizes import train_flops_per_token
from neobert_jax.config import train as train_config
from neobert_jax.engine import metrics as metrics_lib
from neobert_jax.engine import optimizer as optimizer_lib
from neobert_jax.engine import step as engine_step
from neobert_jax.train import mlm
from tests.support.tiny_train import mlm_rows, tiny_config
from neobert_jax.weights.flat import to_flat

MASK_FRACTION = 0.2
Run = Callable[[int], float]  # step i -> its loss (blocks until the step is done)


def make_config(a: argparse.Namespace, head: str, kernel: str = 'auto', optimizer: str = 'adamw'):
  cfg = tiny_config(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, seq_len=a.seq, batch=a.batch)
  cfg.model.num_heads, cfg.model.intermediate_size = a.heads, 4 * a.hidden
  cfg.model.attention_impl, cfg.model.dtype, cfg.optimizer.name = kernel, a.dtype, optimizer
  # Sparse: slots to spare over the 20% masked on average; dense: the step reads the [B, T] labels instead.
  cfg.data.max_predictions = int(round(0.25 * a.seq)) if head == 'sparse' else 0
  cfg.optimizer.warmup_steps, cfg.train.num_steps = 0, 1000
  return cfg


def jax_side(cfg, mode: str, batches: list[dict[str, np.ndarray]]) -> tuple[Run, dict[str, np.ndarray]]:
  """The trainer's step (or its loss's gradients) on one device; returns (run, the initial flat parameters)."""
  mesh = shd.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  cfg, _ = train_config.resolve_train(cfg)  # 'auto' attention and compute dtype, as the trainer resolves them
  defs, state = mlm.create_train_state(cfg, mesh)
  flat = to_flat(nnx.merge(defs.model_def, state['params']))  # the same seed gives every side the same weights
  keys, sharding = mlm.batch_keys(cfg.data.max_predictions), engine_step.micro_batch_sharding(mesh)
  dev = [{k: jax.device_put(b[k][None], sharding) for k in keys} for b in batches]
  if mode == 'step':
    train = mlm.jit_mlm_train_step(cfg, mesh, defs)
    box = {'state': state}

    def run(i: int) -> float:
      box['state'], metrics = train(box['state'], dev[i % len(dev)])
      return float(metrics['loss'])

    return run, flat

  packed, limit = cfg.data.packing == 'packed', mlm.max_segments(cfg.data)

  def loss(params, batch):
    total, (count, _) = mlm.mlm_sums(
      nnx.merge(defs.model_def, params), {k: v[0] for k, v in batch.items()}, packed, limit
    )
    return total / count

  grad = shd.MeshBound(mesh, jax.jit(jax.value_and_grad(loss)))

  def run_grad(i: int) -> float:
    value, grads = grad(state['params'], dev[i % len(dev)])
    jax.block_until_ready(grads)  # the gradients are the work; returning them keeps XLA from dropping it
    return float(value)

  return run_grad, flat


def _torch_decays(name: str, opt_cfg) -> bool:
  """The trainer's weight-decay rule (train/optimizer.py) applied to an HF-layout parameter name."""
  if opt_cfg.decay_all_params:
    return True
  # The HF name of the token embedding does not say 'embedding'; the rule keys on the JAX path.
  names = ['token_embedding', 'embedding'] if name == 'model.encoder.weight' else name.split('.')
  return optimizer_lib.decays(names, bool(opt_cfg.decay_embeddings))


def torch_side(cfg, flat: dict[str, np.ndarray], mode: str, head: str, batches: list[dict[str, np.ndarray]]) -> Run:
  """Our PyTorch NeoBERT with torch's AdamW configured from cfg.optimizer, on the same batches."""
  import torch  # pylint: disable=g-import-not-at-top
  from neobert_jax.convert.torch_ref import torch_model_from_flat  # pylint: disable=g-import-not-at-top

  model = torch_model_from_flat(flat, cfg.model).train()
  o = cfg.optimizer
  groups = {True: [], False: []}
  for name, p in model.named_parameters():
    p.requires_grad_(True)
    groups[_torch_decays(name, o)].append(p)
  opt = torch.optim.AdamW(
    [{'params': groups[True], 'weight_decay': float(o.weight_decay)}, {'params': groups[False], 'weight_decay': 0.0}],
    lr=float(o.peak_lr),
    betas=(float(o.b1), float(o.b2)),
    eps=float(o.eps),
  )
  tb = [
    {k: torch.from_numpy(v) if v.dtype == np.float32 else torch.from_numpy(v).long() for k, v in b.items()}
    for b in batches
  ]

  def loss_of(b) -> torch.Tensor:
    ones = torch.ones_like(b['input_ids'])
    if head == 'dense':  # every token's logits, cross-entropy where labels != -100 (the HF model's own loss)
      return model(input_ids=b['input_ids'], attention_mask=ones, labels=b['labels']).loss
    hidden = model.model(input_ids=b['input_ids'], attention_mask=ones).last_hidden_state
    picked = torch.take_along_dim(hidden, b['mlm_positions'][..., None], dim=1)
    ce = torch.nn.functional.cross_entropy(
      model.decoder(picked).flatten(0, 1), b['mlm_labels'].flatten(), reduction='none'
    )
    w = b['mlm_weights'].flatten()
    return (ce * w).sum() / w.sum()

  def run(i: int) -> float:
    opt.zero_grad(set_to_none=True)
    loss = loss_of(tb[i % len(tb)])
    loss.backward()
    if mode == 'step':
      if o.clip_norm > 0:  # torch divides by (norm + 1e-6): optimizer.clip_eps's default, the original trainer's
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(o.clip_norm))
      lr = float(optimizer_lib.lr_values(o, int(cfg.train.num_steps), np.array([i]))[0])
      for g in opt.param_groups:
        g['lr'] = lr
      opt.step()
    return float(loss.detach())

  return run


def interleaved(sides: dict[str, Run], steps: int, warmup: int) -> tuple[dict[str, float], dict[str, list]]:
  """(median step seconds, each step's loss) of each side; steps alternate between sides.

  The losses check the comparison: the sides start equal, and in step mode they stay close only while the two
  optimizers do the same update."""
  losses, times = {name: [] for name in sides}, {name: [] for name in sides}
  for i in range(warmup + steps):  # the warmup steps include JAX's compilation
    for name, run in sides.items():
      start = time.perf_counter()
      losses[name].append(run(i))
      if i >= warmup:
        times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}, losses


def torch_matmul_peak(n: int = 2048, seconds: float = 1.0) -> float:
  import torch  # pylint: disable=g-import-not-at-top

  a = torch.ones(n, n)
  a @ a
  reps, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds or reps < 3:
    a @ a
    reps += 1
  return 2 * n**3 * reps / (time.perf_counter() - start)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--layers', type=int, default=4)
  p.add_argument('--hidden', type=int, default=768)
  p.add_argument('--heads', type=int, default=12)
  p.add_argument('--seq', type=int, default=512)
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--steps', type=int, default=5, help='timed steps per side')
  p.add_argument('--warmup', type=int, default=2, help='untimed steps per side (JAX compiles in the first)')
  p.add_argument(
    '--mode', choices=('step', 'grad'), default='step', help='step: the full train step; grad: forward + backward only'
  )
  p.add_argument('--head', nargs='+', choices=('sparse', 'dense'), default=['sparse'])
  p.add_argument('--attention', nargs='+', default=['auto'], help='model.attention_impl of each JAX side')
  p.add_argument('--no-torch', '--skip-torch', dest='torch', action='store_false', help='JAX sides only')
  p.add_argument('--optimizer', nargs='+', choices=('adamw', 'muon'), default=['adamw'], help='of each JAX side')
  p.add_argument('--vocab', type=int, default=30522)
  p.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
  a = p.parse_args()

  tokens = a.batch * a.seq
  base = make_config(a, 'sparse')
  batches = [mlm_rows(base, seed, MASK_FRACTION) for seed in range(2)]
  masked = float(np.mean([b['mlm_weights'].sum() for b in batches])) / tokens
  sides, work, flat = {}, {}, None
  for head in a.head:
    fraction = masked if head == 'sparse' else 1.0
    for kernel in a.attention:
      for optimizer in a.optimizer:
        name = f'jax-{kernel}-{head}' if a.optimizer == ['adamw'] else f'jax-{kernel}-{optimizer}-{head}'
        sides[name], flat = jax_side(make_config(a, head, kernel, optimizer), a.mode, batches)
        work[name] = train_flops_per_token(base.model, a.seq, decoder_fraction=fraction)
    if a.torch:
      sides[f'torch-{head}'] = torch_side(make_config(a, head), flat, a.mode, head, batches)
      work[f'torch-{head}'] = work[name]
  peaks = {'xla': max(metrics_lib.measure_matmul_peak(n) for n in (1024, 2048))}
  if a.torch:
    peaks['torch'] = torch_matmul_peak()
  seconds, losses = interleaved(sides, a.steps, a.warmup)
  best = max(peaks.values())
  res = {
    'config': vars(a),
    'tokens_per_step': tokens,
    'masked_fraction': masked,
    'matmul_peak_flops': peaks,
    'sides': {},
  }
  for name, s in seconds.items():
    res['sides'][name] = {
      'step_s': s,
      'tokens_per_s': tokens / s,
      'model_flops': work[name] * tokens / s,
      'frac_of_best_peak': work[name] * tokens / s / best,
      'losses': losses[name],
    }
    head = name.rsplit('-', 1)[1]
    if a.torch and not name.startswith('torch'):
      res['sides'][name]['speedup_vs_torch'] = seconds[f'torch-{head}'] / s
  print(json.dumps(res, indent=2))


if __name__ == '__main__':
  main()
