"""The end-of-run report: the baselines of the held-out split (unigram, neighbour counts), the loss-curve table and
plot (no training needed)."""

import json
import math

import numpy as np
import pytest

from neobert_jax.config import data as config_lib
from tests.support import synthetic_data
from neobert_jax.train import baselines, fill_mask, report


def test_unigram_cross_entropy_is_the_entropy_of_the_held_out_non_special_tokens(tmp_path):
  # Every document: [CLS] doc-id a a b [SEP] -> per document ids {doc-id: 1, a: 2, b: 1} after dropping specials.
  docs = []
  for i in range(4):
    d = np.array(
      [synthetic_data.SPECIAL['cls'], synthetic_data.FIRST_DOC_ID + i, 500, 500, 501, synthetic_data.SPECIAL['sep']],
      np.int32,
    )
    docs.append(d)
  synthetic_data.write_prepared(str(tmp_path), docs, max_length=16, eval_docs=docs)
  cfg = config_lib.default_data_config()
  cfg.dir = str(tmp_path)
  counts = np.array([1, 1, 1, 1, 8, 4])  # four doc ids once each, 500 eight times, 501 four times
  p = counts / 16
  got = baselines.context_baselines(cfg, 16, mask_rate=0.4)
  assert got['held_out'] == pytest.approx(float(-(p * np.log(p)).sum()))
  q = (counts + 1) / (16 + 30522)  # the training split holds the same documents; add-one over the vocabulary
  assert got['train'] == pytest.approx(float(-(counts * np.log(q)).sum() / 16))


def test_baselines_are_computed_once_per_prepared_data_and_mask_rate(tmp_path, monkeypatch):
  """The manifest names each shard by its sha256: the same data at the same rate reads the first result back, new
  data or another rate counts afresh."""
  monkeypatch.setenv('NEOBERT_JAX_CACHE', str(tmp_path / 'cache'))
  calls = []
  counted = baselines.neighbours
  monkeypatch.setattr(baselines, 'neighbours', lambda *a, **k: calls.append(a[-1]) or counted(*a, **k))
  docs = [np.array([101, 1000 + i, 500, 501, 500, 102], np.int32) for i in range(6)]
  cfg = config_lib.default_data_config()
  for name, eval_docs in (('a', docs[:2]), ('b', [np.array([101, 2000, 2000, 2000, 501, 102], np.int32)])):
    synthetic_data.write_prepared(str(tmp_path / name), docs, max_length=16, eval_docs=eval_docs)
  cfg.dir = str(tmp_path / 'a')
  first = baselines.context_baselines(cfg, 16, mask_rate=0.4)
  assert baselines.context_baselines(cfg, 16, mask_rate=0.4) == first and calls == [0.4]
  baselines.context_baselines(cfg, 16, mask_rate=0.2)
  cfg.dir = str(tmp_path / 'b')
  other = baselines.context_baselines(cfg, 16, mask_rate=0.4)
  assert calls == [0.4, 0.2, 0.4] and other['held_out'] != first['held_out']
  assert len(list((tmp_path / 'cache' / 'baselines').glob('*.json'))) == 3


def test_loss_curve_table_keeps_held_out_rows_and_the_unigram_line(tmp_path):
  rows = [{'step': s, 'train/loss': 10.0 - s / 10} for s in range(10, 101, 10)]
  rows += [{'step': 50, 'eval/loss': 6.5, 'eval/accuracy': 0.1}, {'step': 100, 'eval/loss': 6.0, 'eval/accuracy': 0.2}]
  rows += [
    {'step': 0, 'eval/probe/fine_food/random_init_accuracy': 0.66},
    {'step': 100, 'eval/probe/fine_food/accuracy': 0.7},
  ]
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
  bars = {'held_out': math.log(800), 'train': 7.0, 'neighbours': {'loss': 5.25, 'accuracy': 0.125, 'k': 0.1}}
  text = report.write_table(tmp_path, bars, every=40).read_text()
  assert '(context-free): 6.685 (its own token frequencies), 7.000' in text
  assert "evaluation's rate, k=0.1): 5.250, accuracy 0.125" in text
  assert '- probe/fine_food: a random init of this shape scores 0.660' in text
  assert '| 50 | 5.000 | 6.500 | 0.100 |  |' in text and '| 100 | 0.000 | 6.000 | 0.200 | 0.700 |' in text
  assert '| 40 | 6.000 |  |  |  |' in text and '| 30 |' not in text
  png = report.write_plot(tmp_path, bars)
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def _by_hand(train, held_out, vocab, special, rate, k):
  """The neighbour predictor written out position by position, case by case (loops, no matrices)."""
  pairs, uni = {}, {}
  for d in train:
    for a, b in zip(d[:-1], d[1:]):
      pairs[(a, b)] = pairs.get((a, b), 0) + 1
    for t in d:
      if t not in special:
        uni[t] = uni.get(t, 0) + 1
  follows = {a: sum(c for (x, _), c in pairs.items() if x == a) for a in range(vocab)}
  cands = [x for x in range(vocab) if x not in special]
  p_next = lambda a, b: (pairs.get((a, b), 0) + k) / (follows[a] + k * vocab)
  prior = lambda x: uni.get(x, 0) + k
  loss = acc = n = 0.0
  for d in held_out:
    for i in range(1, len(d) - 1):
      if d[i] in special:
        continue
      l, x, r = d[i - 1], d[i], d[i + 1]
      seen_l = 1.0 if l in special else 1 - rate
      seen_r = 1.0 if r in special else 1 - rate
      for w, use_l, use_r in (
        (seen_l * seen_r, 1, 1),
        (seen_l * (1 - seen_r), 1, 0),
        ((1 - seen_l) * seen_r, 0, 1),
        ((1 - seen_l) * (1 - seen_r), 0, 0),
      ):
        score = {c: (p_next(l, c) if use_l else prior(c)) * (p_next(c, r) if use_r else 1.0) for c in cands}
        loss += w * -math.log(score[x] / sum(score.values()))
        acc += w * (max(cands, key=lambda c: score[c]) == x)
      n += 1
  return loss / n, acc / n


@pytest.mark.parametrize('rate', [0.0, 0.4])
def test_neighbour_baseline_equals_the_counts_worked_by_hand(rate):
  special = {0, 1, 2, 3, 4}
  train = [[2, 5, 6, 7, 3], [2, 5, 6, 3], [2, 7, 5, 5, 6, 3], [2, 6, 7, 3]]
  held_out = [[2, 5, 6, 7, 3], [2, 7, 7, 5, 3]]
  arrays = lambda docs: [np.asarray(d, np.int32) for d in docs]
  got = baselines.neighbours(arrays(train), arrays(held_out), special, 8, rate, smoothing=(0.5,))
  loss, acc = _by_hand(train, held_out, 8, special, rate, 0.5)
  assert got['loss'] == pytest.approx(loss, rel=1e-9) and got['accuracy'] == pytest.approx(acc, rel=1e-9)
  assert got['k'] == 0.5


def test_neighbour_baseline_is_exact_on_a_deterministic_language_and_picks_the_best_k():
  # 5 -> 6 -> 7 -> 5 ... always: with both neighbours visible the middle token is certain; at a mask rate of 0.4
  # the predictor still gets every token right (one visible neighbour suffices) but is less sure.
  cycle = [5, 6, 7] * 20
  docs = [np.asarray([2] + cycle[s : s + 30] + [3], np.int32) for s in range(3)]
  sure = baselines.neighbours(docs, docs, {0, 1, 2, 3, 4}, 8, 0.0)
  assert sure['accuracy'] == 1.0 and sure['loss'] < 0.01 and sure['k'] == min(baselines.SMOOTHING_GRID)
  masked = baselines.neighbours(docs, docs, {0, 1, 2, 3, 4}, 8, 0.4)
  assert masked['accuracy'] > 0.8 and masked['loss'] > sure['loss']


def test_fill_mask_blanks_one_token_per_row_and_whole_words_only_when_asked(tmp_path):
  from transformers import BertTokenizerFast  # pylint: disable=g-import-not-at-top

  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), words=('the', 'king', 'is', 'dead'))
  tok = BertTokenizerFast(vocab_file=vocab)
  text = ' '.join(['the king is dead , long live the kingdom .'] * 8)
  ids = tok(text)['input_ids']  # [CLS] ... [SEP]; 'kingdom' and 'long' split into pieces
  width = 40
  records = [np.asarray(ids, np.int32)] * 30 + [np.asarray(ids[:10], np.int32)]  # one row too short to use
  pieces = tok.convert_ids_to_tokens(ids[1:-1][:width])
  for words_only in (False, True):
    blanked = fill_mask.blank_rows(records, tok, width, 20, np.random.default_rng(3), words_only)
    assert len(blanked) == 20
    for row, blank, answer in blanked:
      assert len(row) == width + 2 and row[0] == tok.cls_token_id and row[-1] == tok.sep_token_id
      assert row.count(tok.mask_token_id) == 1 and row[blank] == tok.mask_token_id
      assert answer == pieces[blank - 1]  # the token the blank hides
      if words_only:  # a whole word: alphabetic, and the next token does not continue it
        assert answer.isalpha() and not pieces[blank].startswith('##')
    kinds = {answer for _, _, answer in blanked}
    assert (kinds <= {'the', 'king', 'is', 'dead'}) == words_only, kinds


def test_fill_mask_sentences_are_cut_at_sentence_ends_and_stand_alone(tmp_path):
  from transformers import BertTokenizerFast  # pylint: disable=g-import-not-at-top

  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), words=('the', 'king', 'is', 'dead'))
  tok = BertTokenizerFast(vocab_file=vocab)
  # Sentences of 8 tokens ('the king is dead , the king .') and of 3 ('the king !', too short to ask about).
  doc = tok('the king is dead , the king . the king ! the king is dead , the king ?')['input_ids']
  records = [np.asarray(doc, np.int32)] * 5
  blanked = fill_mask.blank_sentences(records, tok, 20, 100, np.random.default_rng(0))
  assert len(blanked) == 10  # two long sentences a document, all there are
  whole = tok.convert_ids_to_tokens(tok('the king is dead , the king .')['input_ids'][1:-1])
  for row, blank, answer in blanked:
    assert row[0] == tok.cls_token_id and row[-1] == tok.sep_token_id and len(row) == 10
    assert row.count(tok.mask_token_id) == 1 and row[blank] == tok.mask_token_id
    filled = tok.convert_ids_to_tokens(row[1:-1])
    filled[blank - 1] = answer
    assert filled[:7] == whole[:7] and filled[7] in ('.', '?')  # the sentence itself, its end mark kept
  assert len(fill_mask.blank_sentences(records, tok, 7, 100, np.random.default_rng(0))) == 0  # longer than allowed
