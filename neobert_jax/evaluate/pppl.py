"""Pseudo-perplexity (Salazar et al. 2020): every real token masked in its own copy of the text and scored by
-log p(token | the rest); PPPL = exp(total NLL / scored tokens). The masked copies are laid out in a few power-of-two
bucket lengths, so one jitted function (compiled once per bucket) does the corpus, decoding only the masked slot."""

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from neobert_jax.downstream import batching


@dataclasses.dataclass
class PPPLResult:
  pppl: float
  nll: float  # mean negative log-likelihood per scored token (nats)
  tokens: int
  per_document: list[dict[str, float]]


def masked_rows(seqs: Sequence[np.ndarray], bucket_list: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
  """{bucket length: rows 'doc', 'pos', 'length'}: one row per (document, scored position)."""
  out: dict[int, dict[str, list]] = {}
  for d, s in enumerate(seqs):
    n = len(s)
    if n <= 2:
      continue
    b = batching.bucket_for(n, bucket_list)
    rows = out.setdefault(b, {'doc': [], 'pos': [], 'length': []})
    pos = np.arange(1, n - 1)
    rows['doc'].append(np.full_like(pos, d))
    rows['pos'].append(pos)
    rows['length'].append(np.full_like(pos, n))
  return {b: {k: np.concatenate(v).astype(np.int32) for k, v in r.items()} for b, r in out.items()}


def jit_scorer(model_def: Any, param_shardings: Any, mesh: jax.sharding.Mesh) -> Callable:
  """Jitted (params, ids [B, T], lengths [B], positions [B], targets [B]) -> nll [B] float32."""

  def score(params, ids, lengths, positions, targets):
    model = nnx.merge(model_def, params)
    logits = model(ids, lengths=lengths, mlm_positions=positions[:, None])[:, 0]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]

  return batching.jit_rows(score, param_shardings, mesh, rows=4)


def pseudo_perplexity(
  score: Callable,
  params: Any,
  seqs: Sequence[np.ndarray],
  mask_id: int,
  pad_id: int,
  batch_size: int,
  bucket_list: Sequence[int],
  mesh: jax.sharding.Mesh,
  progress: Any = None,
) -> PPPLResult:
  """Scores every real token of every sequence (framed ids) with `score` (see jit_scorer)."""
  nll_sum = np.zeros(len(seqs), np.float64)
  count = np.zeros(len(seqs), np.int64)
  for length, rows in sorted(masked_rows(seqs, bucket_list).items()):
    for start in range(0, len(rows['doc']), batch_size):
      doc, pos, n = (rows[k][start : start + batch_size] for k in ('doc', 'pos', 'length'))
      real = len(doc)
      ids, lengths = batching.pad_rows([seqs[d] for d in doc], batch_size, length, pad_id)
      positions = np.pad(pos, (0, batch_size - real))
      targets = ids[np.arange(batch_size), positions].copy()
      ids[np.arange(real), pos] = mask_id
      g = batching.shard_rows({'ids': ids, 'lengths': lengths, 'positions': positions, 'targets': targets}, mesh)
      nll = np.asarray(score(params, g['ids'], g['lengths'], g['positions'], g['targets']), np.float64)[:real]
      np.add.at(nll_sum, doc, nll)
      np.add.at(count, doc, 1)
      if progress is not None:
        progress.update(real)
  total, tokens = float(nll_sum.sum()), int(count.sum())
  means = np.where(count > 0, nll_sum / np.maximum(count, 1), np.nan)  # nan: a document too short to score
  per_doc = [
    {'index': i, 'tokens': int(c), 'nll': float(m), 'pppl': math.exp(m)} for i, (m, c) in enumerate(zip(means, count))
  ]
  mean = total / max(tokens, 1)
  return PPPLResult(pppl=float(math.exp(mean)), nll=mean, tokens=tokens, per_document=per_doc)
