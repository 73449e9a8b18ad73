"""InfoNCE with in-batch negatives over the whole data-parallel batch (NeoBERT's SupConLoss, in JAX).

Each query is scored by cosine similarity / temperature against every positive of the GLOBAL batch plus every hard
negative, and the loss is the cross-entropy whose target is the query's own positive. Inside a jitted step the
arrays are global (rows sharded over data x fsdp); the documents are pinned replicated, which makes XLA all-gather
them once so each device scores its own queries against every document of every device, exactly as a single
device would. Padding rows (weight 0) are neither queries nor candidates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from neobert_jax.sharding import constrain

_NEG = -1e9  # a masked candidate's logit: exp underflows to exactly 0 in float32


def normalize(x: jax.Array) -> jax.Array:
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True), 1e-24))


def info_nce(
  queries: jax.Array,
  positives: jax.Array,
  weights: jax.Array,
  temperature: float,
  negatives: jax.Array | None = None,
  negative_weights: jax.Array | None = None,
  reduction: str = 'mean',
) -> tuple[jax.Array, jax.Array]:
  """(loss, number of correctly retrieved queries) for [B, D] queries / positives and optional [N, D] negatives.

  weights [B]: 1 for real rows, 0 for padding. 'mean' averages over real queries, 'sum' adds them up (the
  original trainer's reduction).
  """
  docs, doc_w = positives, weights
  if negatives is not None:
    docs = jnp.concatenate([positives, negatives], axis=0)
    doc_w = jnp.concatenate([weights, negative_weights], axis=0)
  docs = constrain(normalize(docs), (None, None))  # all-gather: every document is a candidate everywhere
  doc_w = constrain(doc_w, (None,))
  q = constrain(normalize(queries), ('batch', None))
  logits = jnp.einsum('bd,nd->bn', q, docs) / temperature
  logits = jnp.where(doc_w[None, :] > 0, logits, _NEG)
  target = jnp.arange(q.shape[0])
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(log_probs, target[:, None], axis=-1)[:, 0]
  w = weights.astype(jnp.float32)
  total = jnp.sum(nll * w)
  loss = total / jnp.maximum(w.sum(), 1.0) if reduction == 'mean' else total
  correct = jnp.sum((jnp.argmax(logits, -1) == target) * w)
  return loss, correct
