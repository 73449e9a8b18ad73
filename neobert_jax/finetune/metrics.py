"""Validation metrics by task type (numpy): accuracy, F1, Matthews correlation; Pearson, Spearman.

F1 is the positive-class F1 for two classes (GLUE's MRPC / QQP convention, class id 1 = positive) and the macro
average otherwise. Matthews correlation uses the multi-class generalisation (R_K), equal to the usual phi for two
classes. Degenerate inputs (a constant prediction) give 0 instead of NaN so "best" comparisons stay total.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

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
  if np.std(a) == 0 or np.std(b) == 0:
    return 0.0
  return float(fn(a, b)[0])


def regression(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
  pred = pred.reshape(-1)
  return {
    'pearson': _corr(stats.pearsonr, y, pred),
    'spearman': _corr(stats.spearmanr, y, pred),
    'mse': float(np.mean((pred - y) ** 2)),
  }


def majority_accuracy(y: np.ndarray) -> float:
  return float(np.bincount(y).max() / len(y))
