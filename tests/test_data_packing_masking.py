"""Packing and masking on plain arrays: nothing lost, nothing crosses documents."""

import numpy as np
import pytest

from neobert_jax.data.pipeline import virtual
from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import packing

SPECIAL_IDS = (0, 1, 2, 3, 4)
V = 5000


def _block(n_docs, seed=0, max_len=200):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, n_docs)
  tokens = rng.integers(5, V, lengths.sum()).astype(np.int32)
  return tokens, lengths


def _documents_of(rows):
  """(row, segment) -> ids, read back from packed rows."""
  out = {}
  for r in range(rows['input_ids'].shape[0]):
    for s in np.unique(rows['segment_ids'][r]):
      if s == 0:
        continue
      sel = rows['segment_ids'][r] == s
      out[(r, int(s))] = (rows['input_ids'][r][sel], rows['positions'][r][sel])
  return out


@pytest.mark.parametrize('mode', ['packed', 'none'])
def test_packing_keeps_every_token_within_its_document(mode):
  tokens, lengths = _block(300, max_len=70)
  rows = packing.pack_block(tokens, lengths, 64, mode, pad_id=0, rng=np.random.default_rng(1))
  pieces = packing.split_long(lengths, 64)
  assert pieces.sum() == tokens.size and pieces.max() <= 64
  docs = _documents_of(rows)
  assert len(docs) == pieces.size
  # Every segment is one contiguous run, positions 0..len-1, and the multiset
  # of segments equals the multiset of document pieces.
  starts = np.cumsum(pieces) - pieces
  want = sorted(tuple(tokens[s : s + n]) for s, n in zip(starts, pieces))
  got = []
  for ids, pos in docs.values():
    np.testing.assert_array_equal(pos, np.arange(len(ids)))
    got.append(tuple(ids))
  assert sorted(got) == want
  for r in range(rows['segment_ids'].shape[0]):  # segments ascend, padding only at the end
    seg = rows['segment_ids'][r]
    real = seg[seg > 0]
    assert np.all(np.diff(real) >= 0) and np.all(seg[len(real) :] == 0)
  if mode == 'none':
    assert rows['segment_ids'].max() == 1


def test_first_fit_packs_tighter_than_one_document_per_row():
  tokens, lengths = _block(2000, max_len=500)
  packed = packing.pack_block(tokens, lengths, 512, 'packed', 0)
  single = packing.pack_block(tokens, lengths, 512, 'none', 0)
  pad = lambda rows: float((rows['segment_ids'] == 0).mean())
  assert pad(packed) < 0.02 < 0.4 < pad(single)


def test_split_long_keeps_lengths():
  out = packing.split_long(np.array([5, 130, 64, 129]), 64)
  np.testing.assert_array_equal(out, [5, 64, 64, 2, 64, 64, 64, 1])


def _mask(rows, **kw):
  args = dict(
    rate=0.2, strategy='all_mask', mask_id=4, is_special=masking.special_table(V, SPECIAL_IDS), max_predictions=0
  )
  args.update(kw)
  return masking.mask_rows(rows['input_ids'], rows['segment_ids'], np.random.default_rng(7), **args)


def _rows_with_specials():
  tokens, lengths = _block(400, max_len=120)
  starts = np.cumsum(lengths) - lengths
  tokens[starts] = 2  # every document starts with [CLS]
  return packing.pack_block(tokens, lengths, 128, 'packed', 0)


def test_all_mask_rate_and_specials_never_chosen():
  rows = _rows_with_specials()
  out = _mask(rows)
  chosen = out['labels'] != masking.IGNORE
  eligible = (rows['segment_ids'] > 0) & (rows['input_ids'] > 4)
  assert not np.any(chosen & ~eligible)  # never padding, never [CLS]
  assert abs(chosen.sum() / eligible.sum() - 0.2) < 0.01
  np.testing.assert_array_equal(out['labels'][chosen], rows['input_ids'][chosen])
  assert np.all(out['input_ids'][chosen] == 4)
  np.testing.assert_array_equal(out['input_ids'][~chosen], rows['input_ids'][~chosen])


def test_bert_80_10_10_proportions():
  rows = _rows_with_specials()
  out = _mask(rows, strategy='bert_80_10_10', rate=0.3)
  chosen = out['labels'] != masking.IGNORE
  new, old = out['input_ids'][chosen], rows['input_ids'][chosen]
  n = chosen.sum()
  assert abs((new == 4).sum() / n - 0.8) < 0.02
  assert abs((new == old).sum() / n - 0.1) < 0.02
  assert abs(((new != old) & (new != 4)).sum() / n - 0.1) < 0.02
  assert not np.isin(new[new != 4], SPECIAL_IDS).any()


def test_prediction_slots_match_dense_labels_and_cap():
  rows = _rows_with_specials()
  out = _mask(rows, rate=0.5, max_predictions=16)
  chosen = out['labels'] != masking.IGNORE
  assert chosen.sum(1).max() == 16  # capped rows
  assert np.all(out['mlm_weights'].sum(1) == chosen.sum(1))
  for r in range(chosen.shape[0]):
    k = int(chosen[r].sum())
    pos = out['mlm_positions'][r, :k]
    np.testing.assert_array_equal(pos, np.flatnonzero(chosen[r]))
    np.testing.assert_array_equal(out['mlm_labels'][r, :k], rows['input_ids'][r, pos])
    assert np.all(out['mlm_weights'][r, k:] == 0)
  assert out['mlm_positions'].dtype == np.int32 and out['mlm_weights'].dtype == np.float32


def test_thinning_a_masked_batch_masks_at_the_lower_rate_and_keeps_it_consistent():
  """data.mask_rate_final: masked at 40%, thinned to keep 15 / 40 of the masked tokens, the batch is one masked at
  15%, its restored tokens back to their ids, its slots weighted only where the label still stands."""
  rows = _rows_with_specials()
  out = masking.thin(_mask(rows, rate=0.4, max_predictions=64), 0.15 / 0.4, np.random.default_rng(3))
  chosen = out['labels'] != masking.IGNORE
  eligible = (rows['segment_ids'] > 0) & (rows['input_ids'] > 4)
  assert abs(chosen.sum() / eligible.sum() - 0.15) < 0.01
  np.testing.assert_array_equal(out['input_ids'][~chosen], rows['input_ids'][~chosen])
  assert np.all(out['input_ids'][chosen] == 4)
  weighted = np.zeros_like(chosen)
  np.put_along_axis(weighted, out['mlm_positions'], out['mlm_weights'] > 0, axis=1)
  np.testing.assert_array_equal(weighted, chosen)
  assert out['mlm_weights'].dtype == np.float32 and out['input_ids'].dtype == np.int32


@pytest.mark.parametrize('n', [1, 2, 3, 17, 1000, 4097])
def test_block_shuffle_is_a_permutation_that_changes_per_epoch(n):
  idx = np.arange(n)
  a = virtual.permute(idx, n, seed=0, epoch=0)
  assert sorted(a.tolist()) == list(range(n))
  np.testing.assert_array_equal(virtual.permute(idx[::-1], n, 0, 0), a[::-1])  # pointwise
  if n > 10:
    assert not np.array_equal(a, virtual.permute(idx, n, seed=0, epoch=1))
    assert not np.array_equal(a, virtual.permute(idx, n, seed=1, epoch=0))
  if n > 1000:
    assert abs(np.corrcoef(idx, a)[0, 1]) < 0.1  # far from the identity
