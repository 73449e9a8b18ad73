"""The contrastive task: (query, positive[, hard negative]) rows -> InfoNCE training and retrieval validation, with
the paper's MTEB prefixes; a batch's texts are padded to one bucket length, so the step compiles once per bucket."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from neobert_jax.downstream import batching, heads, tables
from neobert_jax.errors import DataError
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
  """InfoNCE with in-batch negatives over the whole data-parallel batch (NeoBERT's SupConLoss): (loss, queries
  retrieved) for [B, D] queries / positives and optional [N, D] negatives; documents pinned replicated (one all-gather),
  weights [B] 0 for padding rows; 'mean' averages over real queries, 'sum' adds them (the original's reduction)."""
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


def _instructions(path: str) -> dict[str, str]:
  if not path:
    return {}
  try:
    table = json.loads(Path(path).read_text())
  except (OSError, ValueError) as e:
    raise DataError(
      f'data.instructions={path}: not a readable JSON file ({e}); give {{"dataset": "instruction", ...}}'
    ) from None
  if not isinstance(table, dict):
    raise DataError(f'data.instructions={path}: expected a JSON object {{"dataset": "instruction"}}')
  return {str(k): str(v) for k, v in table.items()}


class ContrastiveTask:
  """Sentence-embedding fine-tuning with in-batch (global) negatives."""

  kind = 'contrastive'

  def __init__(self, cfg: ml_collections.ConfigDict, tok: Any):
    d = cfg.data
    self.cfg, self.pad_id = cfg, tok.pad_id
    self.has_negatives = d.negative_field != ''
    self.instructions = _instructions(d.instructions)
    columns = ('query_field', 'positive_field', 'negative_field', 'dataset_field')
    fields = [(f'data.{f}', getattr(d, f)) for f in columns]
    train = tables.read_table(d.train_file, d.format)
    tables.require_columns(train, d.train_file, fields)
    n = len(train[d.query_field])
    if d.validation_file:
      val = tables.read_table(d.validation_file, d.format)
      tables.require_columns(val, d.validation_file, fields)
      splits = (train, np.arange(n), d.train_file), (val, np.arange(len(val[d.query_field])), d.validation_file)
    else:
      tr, va = tables.split_holdout(n, d.validation_fraction, cfg.seed)
      splits = (train, tr, d.train_file), (train, va, d.train_file)
    self.train, self.val = (self._examples(tok, *s) for s in splits)
    self.buckets = batching.buckets(d.max_length, d.min_bucket)
    self.metric = cfg.eval.metric or 'retrieval_accuracy'
    self.batch_keys = ['q_ids', 'q_lengths', 'p_ids', 'p_lengths', 'weights']
    if self.has_negatives:
      self.batch_keys += ['n_ids', 'n_lengths', 'n_weights']

  def _examples(self, tok: Any, table: dict[str, list], rows: np.ndarray, path: str) -> dict[str, list]:
    d = self.cfg.data
    pick = lambda col: [tables.texts(table, col, path)[i] for i in rows]  # noqa: E731
    datasets = pick(d.dataset_field) if d.dataset_field else [''] * len(rows)
    queries = [
      (f'{self.instructions[ds]} ' if ds in self.instructions else d.query_prefix) + q
      for q, ds in zip(pick(d.query_field), datasets)
    ]
    out = {
      'q': batching.frame(tok, queries, None, d.max_length),
      'p': batching.frame(tok, [d.document_prefix + t for t in pick(d.positive_field)], None, d.max_length),
    }
    if self.has_negatives:
      negs = pick(d.negative_field)
      out['n'] = batching.frame(tok, [d.document_prefix + t for t in negs], None, d.max_length)
      out['n_present'] = [bool(t.strip()) for t in negs]
    return out

  @property
  def num_train(self) -> int:
    return len(self.train['q'])

  def steps_per_epoch(self) -> int:
    return math.ceil(self.num_train / self.cfg.train.batch_size)

  def describe(self) -> str:
    return (
      f'contrastive: {self.num_train} train / {len(self.val["q"])} validation pairs'
      f'{" with hard negatives" if self.has_negatives else ""}'
    )

  def make_model(self, model_cfg: ml_collections.ConfigDict, rngs: Any) -> heads.Embedder:
    return heads.Embedder(model_cfg, self.cfg.head.pooling, rngs=rngs)

  def train_epoch(self, rng: np.random.Generator) -> Iterator[dict[str, np.ndarray]]:
    b = self.cfg.train.batch_size
    order = rng.permutation(self.num_train)
    groups = ('q', 'p', 'n') if self.has_negatives else ('q', 'p')
    for start in range(0, len(order), b):
      idx = order[start : start + b]
      length = batching.bucket_for(max(len(self.train[g][i]) for g in groups for i in idx), self.buckets)
      batch = {'weights': np.zeros((b,), np.float32)}
      batch['weights'][: len(idx)] = 1.0
      for g in groups:
        rows = [self.train[g][i] for i in idx]
        batch[f'{g}_ids'], batch[f'{g}_lengths'] = batching.pad_rows(rows, b, length, self.pad_id)
      if self.has_negatives:
        batch['n_weights'] = np.zeros((b,), np.float32)
        batch['n_weights'][: len(idx)] = [self.train['n_present'][i] for i in idx]
      yield batch

  def loss(self, model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, jax.Array]:
    del key
    q = model(batch['q_ids'], batch['q_lengths'])
    p = model(batch['p_ids'], batch['p_lengths'])
    n = model(batch['n_ids'], batch['n_lengths']) if self.has_negatives else None
    h = self.cfg.head
    loss, _ = info_nce(q, p, batch['weights'], h.temperature, n, batch.get('n_weights'), h.loss_reduction)
    return loss, batch['weights'].sum()

  def evaluate(self, predict) -> dict[str, float]:
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    q, p = unit(predict(self.val['q'])), unit(predict(self.val['p']))
    sim = q @ p.T
    own = np.diag(sim)
    rank = (sim > own[:, None]).sum(1)  # documents scored above the query's own positive
    logits = sim / self.cfg.head.temperature
    logits = logits - logits.max(1, keepdims=True)
    nll = -(np.diag(logits) - np.log(np.exp(logits).sum(1)))
    return {
      'retrieval_accuracy': float((rank == 0).mean()),
      'mrr': float((1.0 / (rank + 1)).mean()),
      'loss': float(nll.mean()),
    }
