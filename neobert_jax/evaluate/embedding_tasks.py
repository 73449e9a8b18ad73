"""Scores of frozen embeddings on real data: document similarity (Lee) and topic classification (BBC, kNN)."""

from __future__ import annotations

import numpy as np
from scipy import stats


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def lee_spearman(emb: np.ndarray, pairs: np.ndarray, human: np.ndarray) -> dict[str, float]:
  """Spearman (and Pearson) correlation between pair cosine similarity and the mean human rating."""
  u = _unit(emb)
  cos = np.sum(u[pairs[:, 0]] * u[pairs[:, 1]], -1)
  return {'spearman': float(stats.spearmanr(cos, human)[0]), 'pearson': float(stats.pearsonr(cos, human)[0]),
          'pairs': int(len(pairs))}


def knn_accuracy(emb: np.ndarray, labels: np.ndarray, k: int = 5, folds: int = 5, seed: int = 0) -> dict[str, float]:
  """k-nearest-neighbour (cosine, majority vote, ties to the nearest) accuracy, k-fold cross-validated."""
  u = _unit(emb)
  names, y = np.unique(labels, return_inverse=True)
  order = np.random.default_rng(seed).permutation(len(y))
  correct = 0
  for f in range(folds):
    test = order[f::folds]
    train = np.setdiff1d(order, test)
    sim = u[test] @ u[train].T
    nearest = np.argsort(-sim, axis=1)[:, :k]
    votes = np.zeros((len(test), len(names)))
    for rank in range(k):  # nearer neighbours weigh slightly more, which breaks ties toward the nearest
      np.add.at(votes, (np.arange(len(test)), y[train][nearest[:, rank]]), 1.0 + 1e-3 * (k - rank))
    correct += int((votes.argmax(1) == y[test]).sum())
  majority = float(np.bincount(y).max() / len(y))
  return {'accuracy': correct / len(y), 'majority': majority, 'k': k, 'folds': folds}
