"""Baselines of the held-out MLM loss that need no neural network (unigram cross-entropies, neighbour counts), the
bars a pretraining run has to clear, as docs/configuration.md (the end-of-run report) defines them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import ml_collections
import numpy as np
import scipy.sparse

from neobert_jax import paths
from neobert_jax.data.pipeline import prepared


SMOOTHING_GRID = (0.01, 0.03, 0.1, 0.3)
_CHUNK = 256


def unigram(train: list[np.ndarray], held_out: list[np.ndarray], special_ids, vocab: int) -> dict[str, float]:
  """{'held_out': the held-out entropy, 'train': add-one cross-entropy of train}, in nats, specials excluded."""
  special = np.asarray(sorted(special_ids))
  ev, tr = (x[~np.isin(x, special)] for x in (np.concatenate(held_out), np.concatenate(train)))
  p = np.bincount(ev, minlength=vocab).astype(np.float64) / ev.size
  entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
  q = (np.bincount(tr, minlength=vocab).astype(np.float64) + 1.0) / (tr.size + vocab)
  return {'held_out': entropy, 'train': float(-np.log(q[ev]).mean())}


def _held_out_triples(docs: list[np.ndarray], is_special: np.ndarray) -> tuple[np.ndarray, ...]:
  """(left, token, right) for every non-special held-out token; every one has both neighbours ([CLS]/[SEP])."""
  docs = [d for d in docs if d.size >= 3]
  keep = [~is_special[d[1:-1]] for d in docs]
  places = (np.s_[:-2], np.s_[1:-1], np.s_[2:])
  return tuple(np.concatenate([d[s][k] for d, k in zip(docs, keep)]).astype(np.int64) for s in places)


def neighbours(
  train: list[np.ndarray],
  held_out: list[np.ndarray],
  special_ids,
  vocab: int,
  mask_rate: float,
  smoothing: tuple[float, ...] = SMOOTHING_GRID,
) -> dict[str, float]:
  """{'loss', 'accuracy', 'k'}: the neighbour-count predictor's expected held-out MLM figures at `mask_rate`, best k."""
  is_special = np.zeros(vocab, bool)
  is_special[list(special_ids)] = True
  # counts[a, b]: how often token b follows token a inside a document (specials too; duplicates are summed)
  pairs = [d for d in train if d.size > 1]
  before, after = (np.concatenate([d[s] for d in pairs]).astype(np.int64) for s in (np.s_[:-1], np.s_[1:]))
  counts = scipy.sparse.csr_matrix((np.ones(before.size, np.float64), (before, after)), shape=(vocab, vocab))
  by_right = counts.T.tocsr()  # row r: how often r follows each x
  follows = np.asarray(counts.sum(axis=1)).ravel()  # how often each token has a right neighbour
  tr = np.concatenate(train)
  uni = np.bincount(tr[~is_special[tr]], minlength=vocab).astype(np.float64)
  left, token, right = _held_out_triples(held_out, is_special)
  # A neighbour is hidden only if masking could pick it: specials are never masked.
  p_left = np.where(is_special[left], 1.0, 1.0 - mask_rate)
  p_right = np.where(is_special[right], 1.0, 1.0 - mask_rate)
  best = None
  for k in smoothing:
    loss, acc = _expected_scores(counts, by_right, follows, uni, is_special, left, token, right, p_left, p_right, k)
    if best is None or loss < best['loss']:
      best = {'loss': loss, 'accuracy': acc, 'k': k}
  return best


def _log_normalised(score: np.ndarray, candidate: np.ndarray) -> np.ndarray:
  """log of each row of `score` normalised over the candidate ids (-inf elsewhere)."""
  score = np.where(candidate, score, 0.0)
  with np.errstate(divide='ignore'):
    return np.log(score) - np.log(score.sum(axis=-1, keepdims=True))


def _case_sums(logp: np.ndarray, rows: np.ndarray, token: np.ndarray, weight: np.ndarray) -> tuple[float, float]:
  """(sum of weight x -log p(token), sum of weight x [argmax = token]) with logp's row `rows[i]` for position i."""
  return float((weight * -logp[rows, token]).sum()), float((weight * (logp.argmax(axis=-1)[rows] == token)).sum())


def _expected_scores(counts, by_right, follows, uni, is_special, left, token, right, p_left, p_right, k):
  """Sums over the four visibility cases; only 'both visible' is scored per position (in chunks)."""
  vocab = uni.size
  candidate = ~is_special
  prior = np.where(candidate, (uni + k) / (uni.sum() + k * vocab), 0.0)
  p_next = lambda rows: (counts[rows].toarray() + k) / (follows[rows, None] + k * vocab)  # p(x | left)
  p_prev = lambda rows: (by_right[rows].toarray() + k) / (follows[None, :] + k * vocab)  # p(right | x)
  loss, acc = _case_sums(
    _log_normalised(prior, candidate)[None], np.zeros_like(token), token, (1 - p_left) * (1 - p_right)
  )
  lefts, left_row = np.unique(left, return_inverse=True)
  rights, right_row = np.unique(right, return_inverse=True)
  for rows, weight, make in (
    (left_row, p_left * (1 - p_right), lambda: p_next(lefts)),
    (right_row, (1 - p_left) * p_right, lambda: prior * p_prev(rights)),
  ):
    l_, a_ = _case_sums(_log_normalised(make(), candidate), rows, token, weight)
    loss, acc = loss + l_, acc + a_
  for start in range(0, token.size, _CHUNK):
    sl = slice(start, start + _CHUNK)
    logp = _log_normalised(p_next(left[sl]) * p_prev(right[sl]), candidate)
    l_, a_ = _case_sums(logp, np.arange(logp.shape[0]), token[sl], p_left[sl] * p_right[sl])
    loss, acc = loss + l_, acc + a_
  return loss / token.size, acc / token.size


_BASELINES_VERSION = 1  # bump when this module changes what it computes: the cached results go stale
_TRAIN_SAMPLE_TOKENS = 20_000_000


def context_baselines(data_cfg: ml_collections.ConfigDict, seq_len: int, mask_rate: float) -> dict[str, Any]:
  """{'held_out', 'train'} unigram cross-entropies and 'neighbours' at `mask_rate` (at most 20M training tokens)."""
  manifest = prepared.open_prepared(data_cfg, seq_len)[1]
  # The manifest names every shard by its sha256, so it and the arguments pin the result: a re-run, a resume and
  # every run on the same prepared data read it back instead of counting again.
  key = json.dumps([_BASELINES_VERSION, manifest.text(), seq_len, mask_rate, _TRAIN_SAMPLE_TOKENS], sort_keys=True)
  cached = paths.cache_dir('baselines') / f'{hashlib.sha256(key.encode()).hexdigest()[:32]}.json'
  if cached.is_file():
    return json.loads(cached.read_text())
  held_out = prepared.read_heldout_split(data_cfg, seq_len, 'eval')[0]
  train = prepared.read_heldout_split(data_cfg, seq_len, 'train', max_tokens=_TRAIN_SAMPLE_TOKENS)[0]
  special, vocab = list(manifest.special_ids.values()), manifest.vocab_size
  out: dict[str, Any] = unigram(train, held_out, special, vocab)
  out['neighbours'] = neighbours(train, held_out, special, vocab, mask_rate)
  paths.write_text(cached, json.dumps(out))  # whole or absent, whichever process finishes first
  return out


def source_baselines(
  data_cfg: ml_collections.ConfigDict,
  seq_len: int,
  mask_rate: float,
  when: str,
  sources: prepared.Sources | None = None,
) -> dict[str, dict]:
  """Each source's bars, from its own splits; none with eval.baselines (`when`) 'off'."""
  sources = sources or prepared.open_data(data_cfg, seq_len)
  names = sources.with_eval() if when != 'off' else ()
  return {name: context_baselines(sources.config(data_cfg, name), seq_len, mask_rate) for name in names}


def baseline_lines(bars: dict[str, Any]) -> list[str]:
  """The bars, one line each (the log, loss_curve.md)."""
  lines = [
    f'unigram cross-entropy of the held-out split (context-free): {bars["held_out"]:.3f} (its own token '
    f"frequencies), {bars['train']:.3f} (the training split's)"
  ]
  if 'neighbours' in bars:
    n = bars['neighbours']
    lines.append(
      f'neighbour counts (bigram p(x | left) p(right | x) from the training split, neighbours masked at the '
      f"evaluation's rate, k={n['k']}): {n['loss']:.3f}, accuracy {n['accuracy']:.3f}"
    )
  return lines
