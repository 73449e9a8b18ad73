"""JAX NeoBERT vs our PyTorch NeoBERT, same weights and batch, one process: MLM train-step tokens/s on CPU.

Default is the 'bench-768' config of ../shared/reference/performance.md: 4 layers x 768, 12 heads, vocab 30522,
sequence 512, batch 4, fp32, 20% of tokens carrying the loss, AdamW (0.9, 0.95, eps 1e-8, wd 0.1) after global-norm
clipping at 1.0. The PyTorch side is the faithful eager NeoBERT (logits for every token, cross-entropy with -100
ignored). The JAX side runs twice: 'dense' (same work as PyTorch) and 'sparse' (decoder only at the masked
positions, what the trainer does). Steps are interleaved (torch, jax-dense, jax-sparse, torch, ...) so load from
other processes hits all sides alike; the median step time is reported. Compilation is excluded (warmup steps).

  python -m neobert_jax.bench.model_vs_torch [--layers 4] [--seq 512] [--batch 4] [--steps 4] [--no-optimizer]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx

from neobert_jax.convert import torch_ref
from neobert_jax.model import NeoBERTForMLM, default_model_config, to_flat, train_flops_per_token

MASK_FRACTION = 0.2


def make_batch(cfg, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Full rows (no padding), 20% of positions selected and replaced by [MASK] (103)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1000, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
  n_pred = int(round(MASK_FRACTION * seq))
  mlm_positions = np.sort(np.stack([rng.choice(seq, n_pred, replace=False) for _ in range(batch)]), axis=1)
  mlm_positions = mlm_positions.astype(np.int32)
  mlm_labels = np.take_along_axis(ids, mlm_positions, axis=1)
  labels = np.full_like(ids, -100)
  np.put_along_axis(labels, mlm_positions, mlm_labels, axis=1)
  inputs = ids.copy()
  np.put_along_axis(inputs, mlm_positions, 103, axis=1)
  return {"input_ids": inputs, "labels": labels, "mlm_positions": mlm_positions, "mlm_labels": mlm_labels}


def adamw(lr: float) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))


def jax_step_fn(model, sparse: bool, use_optimizer: bool, lr: float):
  """A jitted (params, opt_state, batch) -> (params, opt_state, loss) step, and its initial state."""
  graphdef, params = nnx.split(model)
  tx = adamw(lr)

  def loss_fn(p, batch):
    m = nnx.merge(graphdef, p)
    if sparse:
      logits = m(batch["input_ids"], mlm_positions=batch["mlm_positions"])
      labels = batch["mlm_labels"]
      weights = jnp.ones(labels.shape, jnp.float32)
    else:
      logits = m(batch["input_ids"])
      weights = (batch["labels"] >= 0).astype(jnp.float32)
      labels = jnp.maximum(batch["labels"], 0)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return (ce * weights).sum() / weights.sum()

  def step(p, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(p, batch)
    if use_optimizer:
      updates, opt_state = tx.update(grads, opt_state, p)
      p = optax.apply_updates(p, updates)
    else:  # keep the gradients alive so XLA cannot drop the backward pass
      p = jax.tree.map(lambda a, g: a - 0.0 * g, p, grads)
    return p, opt_state, loss

  keys = ("input_ids", "mlm_positions", "mlm_labels") if sparse else ("input_ids", "labels")
  return jax.jit(step, donate_argnums=(0, 1)), params, tx.init(params), keys


class TorchStep:
  def __init__(self, model: torch.nn.Module, use_optimizer: bool, lr: float):
    self.model = model.train()
    for p in self.model.parameters():
      p.requires_grad_(True)
    self.use_optimizer = use_optimizer
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

  def __call__(self, batch: dict[str, torch.Tensor]) -> float:
    out = self.model(input_ids=batch["input_ids"], labels=batch["labels"])
    out.loss.backward()
    if self.use_optimizer:
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
      self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    return out.loss.detach().item()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--hidden", type=int, default=768)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--seq", type=int, default=512)
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--steps", type=int, default=4, help="timed steps per side")
  parser.add_argument("--warmup", type=int, default=1, help="untimed steps per side (JAX compiles in the first)")
  parser.add_argument("--no-optimizer", dest="optimizer", action="store_false",
                      help="time forward + backward only (no clipping / AdamW update)")
  parser.add_argument("--lr", type=float, default=1e-4)
  args = parser.parse_args(argv)

  cfg = default_model_config()
  cfg.num_layers, cfg.hidden_size, cfg.num_heads = args.layers, args.hidden, args.heads
  cfg.intermediate_size = 4 * args.hidden
  cfg.max_length = args.seq
  cfg.attention_impl = "xla"
  tokens = args.batch * args.seq
  print(f"config: {args.layers} layers x {args.hidden}, {args.heads} heads, vocab {cfg.vocab_size}, seq {args.seq}, "
        f"batch {args.batch}, fp32, {'AdamW+clip' if args.optimizer else 'fwd+bwd only'}; "
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)")

  model = NeoBERTForMLM(cfg, rngs=nnx.Rngs(0))
  flat = to_flat(model)
  torch_step = TorchStep(torch_ref.torch_model_from_flat(flat, cfg), args.optimizer, args.lr)
  batch = make_batch(cfg, args.batch, args.seq)
  torch_batch = {k: torch.from_numpy(v).long() for k, v in batch.items()}

  sides = {"torch (eager, dense logits)": None, "jax dense logits": False, "jax sparse head": True}
  runners, losses, times = {}, {}, {name: [] for name in sides}
  for name, sparse in sides.items():
    if sparse is None:
      runners[name] = lambda: torch_step(torch_batch)
      continue
    fn, params, opt_state, keys = jax_step_fn(model, sparse, args.optimizer, args.lr)
    jax_batch = {k: jnp.asarray(batch[k]) for k in keys}
    holder = {"params": jax.tree.map(jnp.copy, params), "opt": opt_state}

    def run(fn=fn, holder=holder, jax_batch=jax_batch):
      holder["params"], holder["opt"], loss = fn(holder["params"], holder["opt"], jax_batch)
      return float(loss)  # blocks until the step is done
    runners[name] = run

  for i in range(args.warmup + args.steps):
    for name, run in runners.items():
      start = time.perf_counter()
      loss = run()
      elapsed = time.perf_counter() - start
      if i == 0:
        losses[name] = loss
        print(f"  first step {name}: loss {loss:.5f}, {elapsed:.1f}s (includes compilation for JAX)")
      if i >= args.warmup:
        times[name].append(elapsed)

  flops_dense = train_flops_per_token(cfg, args.seq)
  flops_sparse = train_flops_per_token(cfg, args.seq, decoder_fraction=MASK_FRACTION)
  print(f"\nmedian of {args.steps} steps, {tokens} tokens per step:")
  rate = {}
  for name, ts in times.items():
    med = statistics.median(ts)
    rate[name] = tokens / med
    flops = flops_sparse if "sparse" in name else flops_dense
    print(f"  {name:30s} {med:7.2f} s/step  {rate[name]:8.1f} tokens/s  "
          f"{rate[name] * flops / 1e9:6.1f} model GFLOP/s  (steps: {', '.join(f'{t:.2f}' for t in ts)})")
  base = rate["torch (eager, dense logits)"]
  print(f"\nratio jax dense / torch:  {rate['jax dense logits'] / base:.2f}x")
  print(f"ratio jax sparse / torch: {rate['jax sparse head'] / base:.2f}x")
  first = [losses["torch (eager, dense logits)"], losses["jax dense logits"], losses["jax sparse head"]]
  print(f"first-step losses agree: {max(first) - min(first):.2e} max difference")


if __name__ == "__main__":
  main()
