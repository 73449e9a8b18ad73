"""Regression fine-tuning on a synthetic target, and the task metrics against hand-computed values."""

import json

import numpy as np
import pytest
from scipy import stats

from neobert_jax.jobs import finetune as finetune_job
from neobert_jax.finetune import classification
from neobert_jax.config.finetune import base_config


def test_classification_metrics_by_hand():
  y = np.array([1, 1, 0, 0, 1, 0])
  p = np.array([1, 0, 0, 1, 1, 0])
  logits = np.eye(2)[p]
  m = classification.classification(y, logits)
  assert m['accuracy'] == pytest.approx(4 / 6)
  assert m['f1'] == pytest.approx(2 / 3)  # positive class: tp 2, fp 1, fn 1
  assert m['mcc'] == pytest.approx((2 * 2 - 1 * 1) / np.sqrt(3 * 3 * 3 * 3))
  three = classification.classification(np.array([0, 1, 2, 2]), np.eye(3)[[0, 1, 2, 1]])
  assert three['f1'] == pytest.approx(np.mean([1.0, 2 / 3, 2 / 3]))
  assert classification.matthews(np.array([0, 1, 0]), np.array([0, 0, 0]), 2) == 0.0


def test_regression_metrics_match_scipy():
  rng = np.random.default_rng(0)
  y = rng.normal(size=200)
  pred = y + rng.normal(scale=0.5, size=200)
  m = classification.regression(y, pred[:, None])
  assert m['pearson'] == pytest.approx(stats.pearsonr(y, pred)[0])
  assert m['spearman'] == pytest.approx(stats.spearmanr(y, pred)[0])


def test_label_mapping_integers_strings_floats():
  assert classification.infer([-1, 1, 1], 'auto', 'x').names == ('-1', '1')
  assert classification.infer(['b', 'a'], 'auto', 'x').values == ('a', 'b')
  assert classification.infer([0.5, 1.25], 'auto', 'x').kind == 'regression'
  spec = classification.infer([1.0, 3.0, 1.0], 'auto', 'x')  # integral floats are classes
  assert spec.kind == 'classification' and list(classification.encode_labels(spec, [3, 1.0], 'x')) == [1, 0]


@pytest.mark.slow
def test_regression_learns_a_synthetic_target(tmp_path):
  # Target: the share of "good" words in a sentence of random filler, which a [CLS] head can read off.
  rng = np.random.default_rng(0)
  filler = 'the a of house river music table green city paper'.split()
  rows = []
  for _ in range(600):
    n = int(rng.integers(4, 12))
    k = int(rng.integers(0, n + 1))
    words = ['good'] * k + list(rng.choice(filler, n - k))
    rng.shuffle(words)
    rows.append({'text': ' '.join(words), 'score': k / n + 0.001})
  path = tmp_path / 'train.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  cfg = base_config('classification')
  m = cfg.model
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 64, 2, 4, 256
  cfg.data.train_file, cfg.data.label_field = str(path), 'score'
  cfg.data.max_length, cfg.data.validation_fraction = 16, 0.2
  cfg.train.batch_size, cfg.train.epochs, cfg.train.eval_batch_size = 32, 6, 64
  cfg.optimizer.lr = 2e-3
  cfg.head.dropout = 0.0
  cfg.logging.progress_bar = False
  results = finetune_job.finetune(cfg, tmp_path / 'run')
  best = results['best']['metrics']
  assert results['kind'] == 'regression' and results['metric'] == 'spearman'
  assert best['spearman'] > 0.8 and best['pearson'] > 0.8, results['evals']
