"""Downstream throughput on this machine: fine-tuning tokens/s and embedding throughput.

python -m benchmarks.downstream [--layers 4 --hidden 768 --heads 12 --seq 128 --batch 16 --steps 5]

* fine-tuning: the real jitted classification step of neobert_jax.finetune (NeoBERT's [CLS] head with dropout,
  cross-entropy, clipped AdamW, state donated) on full rows of `seq` tokens; median step after compilation;
* embedding: the `python -m neobert_jax.embed` path (length-sorted power-of-two buckets, mean pooling) over
  `--texts` texts whose lengths are uniform in [8, seq]; texts/s and real (unpadded) tokens/s, compilation
  excluded by a warm-up pass.
Random weights (speed does not depend on them), vocab 30522, fp32, all local devices on the fsdp axis.

A script, not part of the library (nothing imports it): run it from the repository root as above, or as
`python benchmarks/downstream.py` where the package is installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np
from flax import nnx

from neobert_jax.downstream import batching, heads
from neobert_jax import sharding as shd
from neobert_jax.engine.optimizer import make_finetune_optimizer
from neobert_jax.engine.state import create_state
from neobert_jax.finetune.classification import sequence_loss
from neobert_jax.config.finetune import base_config
from neobert_jax.jobs.finetune import jit_step
from neobert_jax.weights.flat import sharded_params, to_flat


def _model_cfg(a: argparse.Namespace):
  m = base_config().model
  m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size = a.layers, a.hidden, a.heads, 4 * a.hidden
  m.max_length, m.dtype = a.seq, 'float32'
  return m


def finetune_tokens_per_sec(a: argparse.Namespace, mesh) -> dict[str, float]:
  cfg = base_config()
  cfg.train.num_steps = 1000
  model_cfg = _model_cfg(a)
  tx, lr = make_finetune_optimizer(cfg.optimizer, 1000)
  defs, state = create_state(lambda: heads.SequenceClassifier(model_cfg, 2, 0.1, 0.02, rngs=nnx.Rngs(0)), tx, lr, mesh)
  keys = ['input_ids', 'lengths', 'weights', 'labels']
  step = jit_step(defs, mesh, sequence_loss('classification'), keys)
  rng = np.random.default_rng(0)
  b, t = a.batch, a.seq
  host = {
    'input_ids': rng.integers(1000, 30522, (b, t)).astype(np.int32),
    'lengths': np.full((b,), t, np.int32),
    'weights': np.ones((b,), np.float32),
    'labels': rng.integers(0, 2, (b,)).astype(np.int32),
  }
  batch = batching.shard_rows(host, mesh)
  key = jax.random.key(0)
  state, m = step(state, batch, key)  # compile
  jax.block_until_ready(m)
  times = []
  for i in range(a.steps):
    t0 = time.perf_counter()
    state, m = step(state, batch, jax.random.fold_in(key, i))
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  med = statistics.median(times)
  return {'step_s': med, 'tokens_per_s': b * t / med}


def embedding_throughput(a: argparse.Namespace, mesh) -> dict[str, float]:
  model_cfg = _model_cfg(a)
  flat = to_flat(heads.Embedder(model_cfg, 'mean', rngs=nnx.Rngs(0)))
  graphdef, params, shardings = sharded_params(lambda: heads.Embedder(model_cfg, 'mean', rngs=nnx.Rngs(0)), flat, mesh)
  forward = batching.jit_forward(graphdef, shardings, mesh)
  rng = np.random.default_rng(1)
  seqs = [rng.integers(1000, 30522, int(n)).astype(np.int32) for n in rng.integers(8, a.seq + 1, a.texts)]
  bl = batching.buckets(a.seq)
  batch = -(-a.embed_batch // mesh.size) * mesh.size
  batching.run_batched(forward, params, seqs, batch, bl, 0, mesh)  # compile every bucket
  t0 = time.perf_counter()
  batching.run_batched(forward, params, seqs, batch, bl, 0, mesh)
  elapsed = time.perf_counter() - t0
  tokens = sum(len(s) for s in seqs)
  return {'texts_per_s': len(seqs) / elapsed, 'tokens_per_s': tokens / elapsed, 'seconds': elapsed}


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.downstream', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument('--layers', type=int, default=4)
  p.add_argument('--hidden', type=int, default=768)
  p.add_argument('--heads', type=int, default=12)
  p.add_argument('--seq', type=int, default=128)
  p.add_argument('--batch', type=int, default=16)
  p.add_argument('--steps', type=int, default=5)
  p.add_argument('--texts', type=int, default=512)
  p.add_argument('--embed-batch', type=int, default=64)
  a = p.parse_args(argv)
  mesh = shd.inference_mesh()
  out = {
    'config': vars(a),
    'devices': jax.device_count(),
    'finetune': finetune_tokens_per_sec(a, mesh),
    'embedding': embedding_throughput(a, mesh),
  }
  print(json.dumps(out, indent=2))
  return out


if __name__ == '__main__':
  main()
