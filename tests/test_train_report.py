"""The end-of-run report: the unigram baseline of the held-out split and the loss-curve table (no training needed)."""

import json
import math

import numpy as np
import pytest

from neobert_jax.config import data as config_lib
from neobert_jax.data import testing
from neobert_jax.train import report


def test_unigram_cross_entropy_is_the_entropy_of_the_held_out_non_special_tokens(tmp_path):
  # Every document: [CLS] doc-id a a b [SEP] -> per document ids {doc-id: 1, a: 2, b: 1} after dropping specials.
  docs = []
  for i in range(4):
    d = np.array([testing.SPECIAL['cls'], testing.FIRST_DOC_ID + i, 500, 500, 501, testing.SPECIAL['sep']], np.int32)
    docs.append(d)
  testing.write_prepared(str(tmp_path), docs, max_length=16, eval_docs=docs)
  cfg = config_lib.default_data_config()
  cfg.dir = str(tmp_path)
  counts = np.array([1, 1, 1, 1, 8, 4])  # four doc ids once each, 500 eight times, 501 four times
  p = counts / 16
  got = report.unigram_cross_entropy(cfg, 16)
  assert got['held_out'] == pytest.approx(float(-(p * np.log(p)).sum()))
  q = (counts + 1) / (16 + 30522)  # the training split holds the same documents; add-one over the vocabulary
  assert got['train'] == pytest.approx(float(-(counts * np.log(q)).sum() / 16))


def test_loss_curve_table_keeps_held_out_rows_and_the_unigram_line(tmp_path):
  rows = [{'step': s, 'train/loss': 10.0 - s / 10} for s in range(10, 101, 10)]
  rows += [{'step': 50, 'eval/loss': 6.5, 'eval/accuracy': 0.1}, {'step': 100, 'eval/loss': 6.0, 'eval/accuracy': 0.2}]
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
  text = report.write_curve_table(tmp_path, {'held_out': math.log(800), 'train': 7.0}, every=40).read_text()
  assert 'context-free baselines): 6.685 (its own token frequencies), 7.000' in text
  assert '| 50 | 5.000 | 6.500 | 0.100 |' in text and '| 100 | 0.000 | 6.000 | 0.200 |' in text
  assert '| 40 | 6.000 |  |  |' in text and '| 30 |' not in text
