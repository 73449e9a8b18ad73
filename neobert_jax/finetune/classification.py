"""The classification / regression task: files -> framed examples and labels, the loss, validation metrics. What can
be wrong with the input (a file, a column, the labels) is found while the task is built, before anything is written."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from scipy import stats

from neobert_jax import paths
from neobert_jax.downstream import batching, heads, tables
from neobert_jax.errors import DataError

# The label mapping: raw labels (strings, any integers such as -1/1, floats) <-> class ids, in the sorted order of
# the training labels, so the same data always gives the same ids; WORKDIR/labels.json records it, and the export
# writes it into config.json (id2label / label2id).
LABELS_FILE = 'labels.json'


@dataclasses.dataclass(frozen=True)
class LabelSpec:
  kind: str  # 'classification' or 'regression'
  names: tuple[str, ...]  # class id -> label as text (empty for regression)
  values: tuple[Any, ...]  # class id -> the raw value (int or str) as it appeared in the data

  @property
  def num_outputs(self) -> int:
    return 1 if self.kind == 'regression' else len(self.names)

  def to_json(self) -> dict[str, Any]:
    return {'kind': self.kind, 'id2label': dict(enumerate(self.names)), 'values': list(self.values)}


def _is_number(v: Any) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def infer(values: Sequence[Any], task_type: str, where: str) -> LabelSpec:
  """Builds the mapping from the training labels ('auto': non-integral numbers mean regression)."""
  if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
    raise DataError(f'{where}: some rows have no label; fill or drop them')
  numeric = all(_is_number(v) for v in values)
  integral = numeric and all(float(v).is_integer() for v in values)
  kind = task_type if task_type != 'auto' else ('regression' if numeric and not integral else 'classification')
  if kind == 'regression':
    if not numeric:
      bad = next(v for v in values if not _is_number(v))
      raise DataError(f'{where}: regression needs numeric labels; found {bad!r}')
    return LabelSpec('regression', (), ())
  raw = sorted({int(v) for v in values}) if integral else sorted({str(v) for v in values})
  if len(raw) < 2:
    raise DataError(f'{where}: only one label value {raw}; classification needs at least two classes')
  return LabelSpec('classification', tuple(str(v) for v in raw), tuple(raw))


def encode_labels(spec: LabelSpec, values: Sequence[Any], where: str) -> np.ndarray:
  """Class ids (int32) or regression targets (float32)."""
  if spec.kind == 'regression':
    return np.asarray(values, np.float32)
  index = {str(int(v)) if _is_number(v) else str(v): i for i, v in enumerate(spec.values)}
  keys = [str(int(v)) if _is_number(v) and float(v).is_integer() else str(v) for v in values]
  unknown = sorted({k for k in keys if k not in index})
  if unknown:
    raise DataError(f'{where}: labels {unknown[:5]} do not occur in the training data {list(spec.names)}')
  return np.asarray([index[k] for k in keys], np.int32)


def load_labels(workdir: str | Path) -> LabelSpec:
  """The mapping the run recorded (LabelSpec.to_json; JSON keys are strings)."""
  d = json.loads((paths.resolved(workdir) / LABELS_FILE).read_text())
  names = tuple(d['id2label'][k] for k in sorted(d['id2label'], key=int))
  return LabelSpec(d['kind'], names, tuple(d['values']))


# Validation metrics (numpy). F1 is the positive-class F1 for two classes (GLUE's MRPC / QQP convention, class id
# 1 = positive) and the macro average otherwise; Matthews correlation is the multi-class generalisation (R_K), the
# usual phi for two classes. Degenerate inputs (a constant prediction) give 0, not NaN, so "best" stays total.
DEFAULT_METRIC = {'classification': 'accuracy', 'regression': 'spearman', 'contrastive': 'retrieval_accuracy'}


def _confusion(y: np.ndarray, p: np.ndarray, k: int) -> np.ndarray:
  c = np.zeros((k, k), np.float64)
  np.add.at(c, (y, p), 1.0)
  return c


def f1(y: np.ndarray, p: np.ndarray, k: int) -> float:
  c = _confusion(y, p, k)
  tp = np.diag(c)
  precision = np.divide(tp, c.sum(0), out=np.zeros(k), where=c.sum(0) > 0)
  recall = np.divide(tp, c.sum(1), out=np.zeros(k), where=c.sum(1) > 0)
  denom = precision + recall
  per_class = np.divide(2 * precision * recall, denom, out=np.zeros(k), where=denom > 0)
  return float(per_class[1] if k == 2 else per_class.mean())


def matthews(y: np.ndarray, p: np.ndarray, k: int) -> float:
  c = _confusion(y, p, k)
  n, correct = c.sum(), np.trace(c)
  t, q = c.sum(1), c.sum(0)
  num = correct * n - t @ q
  den = np.sqrt((n * n - q @ q) * (n * n - t @ t))
  return float(num / den) if den > 0 else 0.0


def classification(y: np.ndarray, logits: np.ndarray) -> dict[str, float]:
  k = logits.shape[-1]
  p = logits.argmax(-1)
  return {'accuracy': float((p == y).mean()), 'f1': f1(y, p, k), 'mcc': matthews(y, p, k)}


def _corr(fn, a: np.ndarray, b: np.ndarray) -> float:
  return 0.0 if np.std(a) == 0 or np.std(b) == 0 else float(fn(a, b)[0])


def regression(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
  pred = pred.reshape(-1)
  return {
    'pearson': _corr(stats.pearsonr, y, pred),
    'spearman': _corr(stats.spearmanr, y, pred),
    'mse': float(np.mean((pred - y) ** 2)),
  }


def sequence_loss(kind: str):
  """(model, batch, key) -> (weighted mean loss, real rows): cross-entropy, or squared error for regression."""

  def loss(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, jax.Array]:
    out = model(batch['input_ids'], batch['lengths'], key)
    w = batch['weights']
    if kind == 'regression':
      per_row = jnp.square(out[:, 0] - batch['labels'].astype(jnp.float32))
    else:
      per_row = optax.softmax_cross_entropy_with_integer_labels(out, batch['labels'])
    count = w.sum()
    return jnp.sum(per_row * w) / jnp.maximum(count, 1.0), count

  return loss


class ClassificationTask:
  """Sentence (pair) classification or regression with NeoBERT's [CLS] head."""

  def __init__(self, cfg: ml_collections.ConfigDict, tok: Any):
    d = cfg.data
    self.cfg, self.pad_id = cfg, tok.pad_id
    fields = [(f'data.{f}', getattr(d, f)) for f in ('text_field', 'text_pair_field', 'label_field')]
    train = tables.read_table(d.train_file, d.format)
    tables.require_columns(train, d.train_file, fields)
    self.spec = infer(train[d.label_field], d.task_type, d.train_file)
    n = len(train[d.label_field])
    if d.validation_file:  # (table, rows, file) of the training and the validation examples
      val = tables.read_table(d.validation_file, d.format)
      tables.require_columns(val, d.validation_file, fields)
      # A validation label set that differs from training's: the two files do not describe one task.
      seen = {str(int(v)) if _is_number(v) and float(v).is_integer() else str(v) for v in val[d.label_field]}
      known = set(self.spec.names)
      if self.spec.kind == 'classification' and seen != known:
        raise DataError(
          f'{d.validation_file}: validation labels {sorted(seen)} differ from training labels {sorted(known)} '
          f'(only in validation: {sorted(seen - known)}, only in training: {sorted(known - seen)}); '
          'use files of the same task, or drop data.validation_file to hold out part of the train file'
        )
      splits = (train, np.arange(n), d.train_file), (val, np.arange(len(val[d.label_field])), d.validation_file)
    else:
      strata = train[d.label_field] if self.spec.kind == 'classification' else None
      tr, va = tables.split_holdout(n, d.validation_fraction, cfg.seed, strata)
      splits = (train, tr, d.train_file), (train, va, d.train_file)
    (self.train_seqs, self.train_y), (self.val_seqs, self.val_y) = (self._examples(tok, *s) for s in splits)
    self.buckets = batching.buckets(d.max_length, d.min_bucket)
    self.kind = self.spec.kind
    self.metric = cfg.eval.metric or DEFAULT_METRIC[self.kind]
    self.loss = sequence_loss(self.kind)

  def _examples(self, tok: Any, table: dict[str, list], rows: np.ndarray, path: str):
    d = self.cfg.data
    text = tables.texts(table, d.text_field, path)
    pair = tables.texts(table, d.text_pair_field, path) if d.text_pair_field else None
    pick = lambda xs: [xs[i] for i in rows]  # noqa: E731
    seqs = batching.frame(tok, pick(text), pick(pair) if pair else None, d.max_length)
    return seqs, encode_labels(self.spec, pick(table[d.label_field]), path)

  batch_keys = ['input_ids', 'lengths', 'weights', 'labels']

  @property
  def num_train(self) -> int:
    return len(self.train_seqs)

  def steps_per_epoch(self) -> int:
    lengths = [len(s) for s in self.train_seqs]
    return len(batching.plan_batches(lengths, self.cfg.train.batch_size, self.buckets, np.random.default_rng(0)))

  def describe(self) -> str:
    what = f'{self.spec.num_outputs} classes {list(self.spec.names)}' if self.kind == 'classification' else 'regression'
    return f'{self.kind}: {what}; {len(self.train_seqs)} train / {len(self.val_seqs)} validation examples'

  def make_model(self, model_cfg: ml_collections.ConfigDict, rngs: Any) -> heads.SequenceClassifier:
    h = self.cfg.head
    return heads.SequenceClassifier(
      model_cfg, self.spec.num_outputs, h.dropout, h.init_range, h.classifier_pooling, rngs=rngs
    )

  def train_epoch(self, rng: np.random.Generator) -> Iterator[dict[str, np.ndarray]]:
    yield from batching.epoch_batches(
      self.train_seqs, {'labels': self.train_y}, self.cfg.train.batch_size, self.buckets, self.pad_id, rng
    )

  def evaluate(self, predict) -> dict[str, float]:
    """predict(seqs) -> [N, outputs]; metrics over the whole validation set."""
    out = predict(self.val_seqs)
    if self.kind == 'regression':
      return regression(self.val_y, out)
    result = classification(self.val_y, out)
    result['majority'] = float(np.bincount(self.val_y).max() / len(self.val_y))
    return result

  def save(self, workdir: paths.Path) -> None:
    paths.write_text(workdir / LABELS_FILE, json.dumps(self.spec.to_json(), indent=2) + '\n')
