"""The exported PyTorch NeoBERT (hf_modeling/model.py) as users run it: the unpadded computation of padded batches
equals the original model's padded one (tests/support/torch_reference.py), attention_mask=None,
output_attentions / output_hidden_states, gradient checkpointing, and float16 / bfloat16 forward and backward with
fully padded rows and extreme lengths, against float32.

Tolerances: float32 comparisons of two summation orders of the same math take 1e-5 (float32 rounding of a few
hundred-term dot products at unit scale, ~1e-6, with headroom for either vendor's kernels). Half precision is
compared with float32 relative to the output's scale: bfloat16 keeps 8 mantissa bits (relative rounding 2^-9 ~ 2e-3
per op) and float16 keeps 11 (2^-12 ~ 2.4e-4); through two blocks' matmuls, norms and softmax the errors compound
to a few units of that (measured: up to 2.8), so the bound is 8 units of rounding times the output's largest
magnitude (bfloat16 1.6e-2, float16 2e-3). Gradients go through twice the ops: 16 units of each tensor's largest
gradient (measured: up to 6.7). The backward pass scales the loss by 2^10, as torch.amp.GradScaler does for float16
(unscaled float16 gradients of ~1e-5 are subnormal and lose digits). Real failures (NaN, a masked key leaking in, a
wrong position) are O(1).
"""

import pytest
import torch

from neobert_jax.convert.hf_modeling import model as hf
from tests.support.torch_reference import padded_reference_forward

HALF_RTOL = {torch.bfloat16: 8 * 2.0**-9, torch.float16: 8 * 2.0**-12}
LOSS_SCALE = 2.0**10


def tiny_config(**kw):
  fields = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=97)
  fields.update(kw)
  return hf.NeoBERTConfig(**fields)


@pytest.fixture(scope='module')
def lm():
  torch.manual_seed(0)
  return hf.NeoBERTLMHead(tiny_config()).eval()


def padded_batch(lengths, width=None, seed=0):
  lengths = torch.tensor(lengths)
  width = width or int(lengths.max())
  mask = (torch.arange(width)[None] < lengths[:, None]).long()
  ids = torch.randint(1, 97, (len(lengths), width), generator=torch.Generator().manual_seed(seed)) * mask
  return ids, mask


# Mixed lengths, an empty row, a row of one token; two rows of equal length.
LENGTHS = [9, 3, 0, 8, 1, 9, 4]


# The attention groups under three prices of a call: every length alone (9, 9 | 8 | 4 | 3 | 1), padding worth 10
# query x key positions (9, 9 | 8 | 4, 3 | 1), and the CPU's price (one padded group).
@pytest.mark.parametrize(
  'call_cost, groups',
  [
    (0, [(18, 9, False), (8, 8, False), (4, 4, False), (3, 3, False), (1, 1, False)]),
    (10, [(18, 9, False), (8, 8, False), (7, 4, True), (1, 1, False)]),
    (None, [(34, 9, True)]),
  ],
)
def test_unpadded_equals_the_original_padded_computation(lm, monkeypatch, call_cost, groups):
  if call_cost is not None:
    monkeypatch.setitem(hf.ATTENTION_CALL_COST, 'cpu', call_cost)
  ids, mask = padded_batch(LENGTHS, width=11)
  rows = lm.model._unpadded_rows(mask != 0, None, False)
  assert rows is not None  # the unpadded path runs
  assert [(stop - start, length, slots is not None) for start, stop, length, slots, _ in rows.groups] == groups
  with torch.no_grad():
    got = lm.model(ids, attention_mask=mask).last_hidden_state
    want = padded_reference_forward(lm.model, ids, mask)
    logits = lm(ids, attention_mask=mask).logits
  valid = mask.bool()
  torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)
  assert (got[~valid] == 0).all() and (logits[~valid] == 0).all()  # padding is scattered back as zeros
  torch.testing.assert_close(logits[valid], lm.decoder(want[valid]), atol=1e-5, rtol=1e-5)
  # Each row alone (no padding, no mask) gives the same tokens.
  for row, length in enumerate(LENGTHS):
    if length:
      with torch.no_grad():
        alone = lm.model(ids[row : row + 1, :length]).last_hidden_state[0]
      torch.testing.assert_close(got[row, :length], alone, atol=1e-5, rtol=1e-5)


# Packed rows: documents of 3, 4, 1 and 5, 5 tokens, padding in both rows; segment ids of another row repeat.
SEGMENTS = [[1, 1, 1, 2, 2, 2, 2, 3, 0, 0, 0], [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0]]


@pytest.mark.parametrize(
  'call_cost, groups', [(0, [(10, 5, False), (4, 4, False), (3, 3, False), (1, 1, False)]), (None, [(18, 5, True)])]
)
def test_packed_rows_are_unpadded_per_document(lm, monkeypatch, call_cost, groups):
  if call_cost is not None:
    monkeypatch.setitem(hf.ATTENTION_CALL_COST, 'cpu', call_cost)
  segments = torch.tensor(SEGMENTS)
  real = segments > 0
  ids = torch.randint(1, 97, segments.shape, generator=torch.Generator().manual_seed(1)) * real
  rows = lm.model._unpadded_rows(None, segments, False)
  assert [(stop - start, length, slots is not None) for start, stop, length, slots, _ in rows.groups] == groups
  with torch.no_grad():
    got = lm(ids, segment_ids=segments).logits
    monkeypatch.setattr(lm.config, 'unpad_inputs', False)  # the padded computation: a [B, 1, T, T] document mask
    want = lm(ids, segment_ids=segments).logits
  torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
  assert (got[~real] == 0).all()


def test_attention_mask_none_and_all_ones_are_the_full_rows(lm):
  ids, _ = padded_batch([6, 6, 6])
  with torch.no_grad():
    none = lm(ids).logits
    ones = lm(ids, attention_mask=torch.ones_like(ids)).logits
    want = lm.decoder(padded_reference_forward(lm.model, ids, None))
  assert torch.equal(none, ones)
  torch.testing.assert_close(none, want, atol=1e-5, rtol=1e-5)


def test_hidden_states_and_attentions_with_padding(lm):
  ids, mask = padded_batch([7, 3, 5])
  with torch.no_grad():
    out = lm(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)  # padded path
    unpadded = lm.model(ids, attention_mask=mask, output_hidden_states=True)
  valid = mask.bool()
  assert len(out.hidden_states) == len(unpadded.hidden_states) == 3 and len(out.attentions) == 2
  for a, b in zip(out.hidden_states, unpadded.hidden_states):
    torch.testing.assert_close(a[valid], b[valid], atol=1e-5, rtol=1e-5)
  weights = out.attentions[0]
  assert weights.shape == (3, 4, 7, 7)
  torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 7))
  assert (weights[1, :, :, 3:] == 0).all()  # padded keys get no weight


def test_gradient_checkpointing_gives_the_same_gradients():
  torch.manual_seed(0)
  model = hf.NeoBERTLMHead(tiny_config()).train()
  ids, mask = padded_batch(LENGTHS)
  labels = torch.where(mask.bool(), ids, -100)

  def grads():
    model.zero_grad()
    model(ids, attention_mask=mask, labels=labels).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

  plain = grads()
  model.gradient_checkpointing_enable()
  assert model.is_gradient_checkpointing and all(b.gradient_checkpointing for b in model.model.transformer_encoder)
  checkpointed = grads()
  model.gradient_checkpointing_disable()
  assert plain.keys() == checkpointed.keys() and len(plain) > 10
  for name in plain:
    torch.testing.assert_close(checkpointed[name], plain[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('unpad', [True, False])
def test_half_precision_forward_and_backward_with_padding_is_finite_and_close(dtype, unpad):
  torch.manual_seed(0)
  ref = hf.NeoBERTLMHead(tiny_config(unpad_inputs=unpad))
  half = hf.NeoBERTLMHead(tiny_config(unpad_inputs=unpad)).to(dtype)
  half.load_state_dict({k: v.to(dtype) for k, v in ref.state_dict().items()})
  ref.load_state_dict({k: v.float() for k, v in half.state_dict().items()})  # the same (rounded) weights
  # Extreme lengths: fully padded rows, a one-token row, full rows, a long width (positions up to 255).
  ids, mask = padded_batch([256, 0, 1, 200, 0, 17], seed=1)
  labels = torch.where(mask.bool(), ids, -100)
  outs = {}
  for name, model in (('ref', ref), ('half', half)):
    model.zero_grad()
    out = model(ids, attention_mask=mask, labels=labels)
    (out.loss * LOSS_SCALE).backward()
    outs[name] = (out.logits.float(), {n: p.grad.float() / LOSS_SCALE for n, p in model.named_parameters()})
  logits, grads = outs['half']
  want_logits, want_grads = outs['ref']
  assert torch.isfinite(logits).all() and all(torch.isfinite(g).all() for g in grads.values())
  rtol = HALF_RTOL[dtype]
  valid = mask.bool()
  scale = want_logits[valid].abs().max()
  assert (logits[valid] - want_logits[valid]).abs().max() <= rtol * scale
  for name, g in grads.items():
    gscale = want_grads[name].abs().max()
    assert (g - want_grads[name]).abs().max() <= 2 * rtol * gscale, name


@pytest.mark.parametrize('call_cost', [0, 10, 1600])
def test_random_masks_with_holes_and_segments_equal_the_padded_computation(lm, monkeypatch, call_cost):
  """Masks with holes anywhere (not only trailing padding), segment ids that repeat within a row, and both at once:
  the unpadded layout equals the dense-mask computation on every real token, and is zero elsewhere."""
  monkeypatch.setitem(hf.ATTENTION_CALL_COST, 'cpu', call_cost)
  for trial in range(12):
    g = torch.Generator().manual_seed(trial)
    batch, width = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 40, (1,), generator=g))
    ids = torch.randint(1, 97, (batch, width), generator=g)
    inputs = {}
    if trial % 3 != 1:
      inputs['attention_mask'] = (torch.rand(batch, width, generator=g) > 0.3).long()
    if trial % 3 != 0:
      inputs['segment_ids'] = torch.randint(0, 4, (batch, width), generator=g)
    real = torch.ones(batch, width, dtype=torch.bool)
    for name in inputs:
      real &= inputs[name] != 0
    with torch.no_grad():
      got = lm(ids, **inputs).logits
      monkeypatch.setattr(lm.config, 'unpad_inputs', False)
      want = lm(ids, **inputs).logits
      monkeypatch.setattr(lm.config, 'unpad_inputs', True)
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    assert (got[~real] == 0).all()
