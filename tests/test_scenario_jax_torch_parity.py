"""The JAX model against our independent PyTorch NeoBERT with the same weights (fp32, CPU).

Weights are random with scales chosen so attention is sharp (not near-uniform) and every parameter, including the
norm scales and the decoder bias, moves the logits: a wrong transpose, head grouping, RoPE pairing or mask shows.
"""

import numpy as np
import pytest
import torch
from flax import nnx

from neobert_jax.convert import torch_ref
from tests.support import torch_reference
from neobert_jax.model import NeoBERTForMLM, default_model_config
from neobert_jax.weights.flat import Dims, flat_shapes, to_flat
from tests.support.tiny_train import model_from_flat

TOL = 1e-4


def model_config(num_layers):
  cfg = default_model_config()
  cfg.num_layers = num_layers
  cfg.scan_layers = True
  cfg.attention_impl = 'xla'
  return cfg


def jax_model_from_flat(flat, cfg):
  return model_from_flat(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)), flat)


def random_flat(cfg, seed):
  rng = np.random.default_rng(seed)
  d = Dims.from_config(cfg)

  def normal(shape, std):  # uniform with the given standard deviation (cheaper to draw than a gaussian)
    return ((rng.random(shape, dtype=np.float32) - 0.5) * np.float32(std * np.sqrt(12.0))).astype(np.float32)

  shapes = flat_shapes(cfg)
  return {
    'encoder.token_embedding.embedding': normal(shapes['encoder.token_embedding.embedding'], 1.0),
    'encoder.layers.attention_norm': 1 + normal(shapes['encoder.layers.attention_norm'], 0.1),
    'encoder.layers.qkv': normal(shapes['encoder.layers.qkv'], 1.5 / np.sqrt(d.dim)),
    'encoder.layers.wo': normal(shapes['encoder.layers.wo'], 1 / np.sqrt(d.dim)),
    'encoder.layers.ffn_norm': 1 + normal(shapes['encoder.layers.ffn_norm'], 0.1),
    'encoder.layers.w12': normal(shapes['encoder.layers.w12'], 1 / np.sqrt(d.dim)),
    'encoder.layers.w3': normal(shapes['encoder.layers.w3'], 1 / np.sqrt(d.ffn)),
    'encoder.final_norm': 1 + normal(shapes['encoder.final_norm'], 0.1),
    'decoder.kernel': normal(shapes['decoder.kernel'], 1 / np.sqrt(d.dim)),
    'decoder.bias': normal(shapes['decoder.bias'], 0.1),
  }


def build_pair(num_layers, seed):
  cfg = model_config(num_layers)
  flat = random_flat(cfg, seed)
  jax_model = jax_model_from_flat(flat, cfg)
  return cfg, flat, jax_model, torch_ref.torch_model_from_flat(flat, cfg)


@pytest.fixture(scope='module')
def pair4():
  return build_pair(4, seed=0)


def padded_batch(rng, lengths, length):
  ids = rng.integers(1, 30522, size=(len(lengths), length)).astype(np.int32)
  mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  return np.where(mask, ids, 0).astype(np.int32), mask


def packed_batch(rng, doc_lengths_per_row, length):
  """Rows of several documents: segment ids 1.., positions restarting at 0 per document, 0-padding at the end."""
  rows = len(doc_lengths_per_row)
  ids = rng.integers(1, 30522, size=(rows, length)).astype(np.int32)
  seg = np.zeros((rows, length), np.int32)
  pos = np.zeros((rows, length), np.int32)
  for r, docs in enumerate(doc_lengths_per_row):
    start = 0
    for doc, n in enumerate(docs, start=1):
      seg[r, start : start + n] = doc
      pos[r, start : start + n] = np.arange(n)
      start += n
  ids = np.where(seg > 0, ids, 0).astype(np.int32)
  return ids, seg, pos


def torch_logits(model, **inputs):
  with torch.no_grad():
    tensors = {k: torch.from_numpy(np.asarray(v)).long() for k, v in inputs.items()}
    return model(**tensors).logits.numpy()


def check_padded(cfg, jax_model, torch_model, seed, lengths, length):
  rng = np.random.default_rng(seed)
  ids, mask = padded_batch(rng, lengths, length)
  got = np.asarray(jax_model(ids, lengths=np.asarray(lengths, np.int32)))
  want = torch_logits(torch_model, input_ids=ids, attention_mask=mask.astype(np.int64))
  assert np.abs(want[mask]).max() > 1.0  # logits are not trivially small
  np.testing.assert_allclose(got[mask], want[mask], atol=TOL, rtol=0)
  return got, ids, mask


def check_packed(cfg, jax_model, torch_model, seed, docs, length):
  rng = np.random.default_rng(seed)
  ids, seg, pos = packed_batch(rng, docs, length)
  got = np.asarray(jax_model(ids, positions=pos, segment_ids=seg))
  want = torch_logits(torch_model, input_ids=ids, segment_ids=seg, position_ids=pos)
  real = seg > 0
  np.testing.assert_allclose(got[real], want[real], atol=TOL, rtol=0)
  # Our torch module derives restarting positions from segment ids when none are given.
  np.testing.assert_allclose(torch_logits(torch_model, input_ids=ids, segment_ids=seg)[real], want[real], atol=1e-6)
  return got, ids, seg


@pytest.mark.slow
def test_padded_batch_4x768(pair4):
  cfg, _, jax_model, torch_model = pair4
  got, _, _ = check_padded(cfg, jax_model, torch_model, seed=1, lengths=[37, 20, 1], length=37)
  assert got.dtype == np.float32 and got.shape == (3, 37, 30522)


def test_unmasked_batch_4x768(pair4):
  cfg, _, jax_model, torch_model = pair4
  ids = np.random.default_rng(2).integers(1, 30522, size=(2, 24)).astype(np.int32)
  np.testing.assert_allclose(np.asarray(jax_model(ids)), torch_logits(torch_model, input_ids=ids), atol=TOL, rtol=0)


def test_packed_rows_4x768(pair4):
  cfg, _, jax_model, torch_model = pair4
  check_packed(cfg, jax_model, torch_model, seed=3, docs=[[11, 9, 12], [30, 2], [5]], length=32)


def test_mlm_positions_4x768(pair4):
  cfg, _, jax_model, torch_model = pair4
  rng = np.random.default_rng(4)
  ids, mask = padded_batch(rng, [16, 10], 16)
  mlm_positions = np.array([[0, 3, 15], [1, 9, 2]], np.int32)
  got = np.asarray(jax_model(ids, lengths=np.array([16, 10], np.int32), mlm_positions=mlm_positions))
  want = torch_logits(torch_model, input_ids=ids, attention_mask=mask.astype(np.int64))
  np.testing.assert_allclose(got, np.take_along_axis(want, mlm_positions[:, :, None], axis=1), atol=TOL, rtol=0)


def test_packed_rows_equal_documents_one_by_one_in_jax(pair4):
  """XLA path: a packed row gives each document the logits it gets alone (positions restart per document)."""
  cfg, _, jax_model, _ = pair4
  docs = [[7, 13, 4], [20]]
  rng = np.random.default_rng(5)
  ids, seg, pos = packed_batch(rng, docs, 24)
  packed = np.asarray(jax_model(ids, positions=pos, segment_ids=seg))
  assert np.isfinite(packed).all()
  # Each document alone in its own row (one compiled shape: rows padded to 20, no mask needed before the end).
  starts = [(r, sum(row[:i]), n) for r, row in enumerate(docs) for i, n in enumerate(row)]
  alone_ids = np.zeros((len(starts), 20), np.int32)
  for j, (r, start, n) in enumerate(starts):
    alone_ids[j, :n] = ids[r, start : start + n]
  lengths = np.array([n for _, _, n in starts], np.int32)
  alone = np.asarray(jax_model(alone_ids, lengths=lengths))
  for j, (r, start, n) in enumerate(starts):
    np.testing.assert_allclose(packed[r, start : start + n], alone[j, :n], atol=2e-5, rtol=0)
  # The unmasked path on one document agrees too.
  r, start, n = starts[0]
  np.testing.assert_allclose(np.asarray(jax_model(ids[r : r + 1, start : start + n]))[0], alone[0, :n], atol=2e-5)


def test_round_trip_jax_torch_jax_is_bit_exact(pair4):
  cfg, flat, jax_model, torch_model = pair4
  exported = to_flat(jax_model)
  for key in flat:
    np.testing.assert_array_equal(exported[key], flat[key], err_msg=key)
  state_dict = {k: v.numpy().copy() for k, v in torch_model.state_dict().items()}
  np.testing.assert_array_equal(state_dict['model.encoder.weight'], flat['encoder.token_embedding.embedding'])
  restored = jax_model_from_flat(torch_reference.flat_from_torch_model(torch_model, cfg), cfg)
  back = to_flat(restored)
  assert back.keys() == exported.keys()
  for key in exported:
    assert back[key].dtype == exported[key].dtype
    np.testing.assert_array_equal(back[key], exported[key], err_msg=key)


@pytest.mark.slow
def test_full_depth_28x768():
  cfg, _, jax_model, torch_model = build_pair(28, seed=6)
  check_padded(cfg, jax_model, torch_model, seed=7, lengths=[12, 7], length=12)
  check_packed(cfg, jax_model, torch_model, seed=8, docs=[[5, 6], [3]], length=12)
