"""Our PyTorch NeoBERT (neobert_jax/convert/hf_modeling/model.py) on its own: layout and numerics conventions."""

import math

import pytest
import torch

from neobert_jax.convert.hf_modeling import model as hf

# The published chandar-lab/NeoBERT checkpoint (NeoBERTLMHead), per block i in 0..27.
PUBLISHED_GLOBAL = {
  'model.encoder.weight': (30522, 768),
  'model.layer_norm.weight': (768,),
  'decoder.weight': (30522, 768),
  'decoder.bias': (30522,),
}
PUBLISHED_BLOCK = {
  'qkv.weight': (2304, 768),
  'wo.weight': (768, 768),
  'ffn.w12.weight': (4096, 768),
  'ffn.w3.weight': (768, 2048),
  'attention_norm.weight': (768,),
  'ffn_norm.weight': (768,),
}


def published_table():
  table = dict(PUBLISHED_GLOBAL)
  for i in range(28):
    table.update({f'model.transformer_encoder.{i}.{k}': v for k, v in PUBLISHED_BLOCK.items()})
  return table


def tiny_config(**kw):
  fields = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=97)
  fields.update(kw)
  return hf.NeoBERTConfig(**fields)


def test_state_dict_matches_published_250m_table():
  with torch.device('meta'):
    model = hf.NeoBERTLMHead(hf.NeoBERTConfig(norm_eps=1e-5))
  got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
  assert got == published_table()
  assert model.config.dim_head == 64
  assert hf.swiglu_hidden_size(3072) == 2048


def test_mapping_shapes_match_published_table():
  from neobert_jax.weights import hf
  from neobert_jax.config.model import default_model_config

  assert hf.hf_shapes(default_model_config()) == published_table()


def test_rotary_is_complex_rotation_of_adjacent_pairs():
  torch.manual_seed(0)
  x = torch.randn(2, 5, 3, 8)
  positions = torch.tensor([[0, 1, 2, 3, 4], [7, 0, 1, 2, 1000]])
  cos, sin = hf.rotary_cos_sin(positions, 8, 10000.0)
  got = hf.apply_rotary(x, cos, sin)
  # Independent formula: x[2i] + j x[2i+1] times exp(j * pos * theta^(-2i/d)), in float64.
  freqs = torch.tensor([10000.0 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
  angle = positions.double()[:, :, None, None] * freqs
  z = torch.view_as_complex(x.double().reshape(2, 5, 3, 4, 2).contiguous()) * torch.polar(torch.ones_like(angle), angle)
  want = torch.view_as_real(z).reshape(2, 5, 3, 8)
  torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-5)


def test_rmsnorm_in_float32_with_eps():
  norm = hf.RMSNorm(4, eps=0.5)
  with torch.no_grad():
    norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
  x = torch.tensor([[1.0, -1.0, 2.0, 0.0]])
  want = x / math.sqrt((1 + 1 + 4) / 4 + 0.5) * norm.weight
  torch.testing.assert_close(norm(x), want)
  assert norm(x.bfloat16()).dtype == torch.bfloat16


def test_qkv_rows_are_grouped_per_head():
  """Head h reads q from rows [3*Dh*h, 3*Dh*h + Dh) of qkv.weight, k and v from the next two Dh-row blocks."""
  config = tiny_config(num_hidden_layers=1)
  torch.manual_seed(0)
  block = hf.EncoderBlock(config)
  dh, heads = config.dim_head, config.num_attention_heads
  x = torch.randn(1, 6, config.hidden_size)
  h_in = block.attention_norm(x)
  w = block.qkv.weight
  cos, sin = hf.rotary_cos_sin(torch.arange(6)[None], dh, config.rope_theta)
  outs = []
  for h in range(heads):
    rows = w[3 * dh * h : 3 * dh * (h + 1)]
    q, k, v = (h_in @ rows[j * dh : (j + 1) * dh].T for j in range(3))
    q = hf.apply_rotary(q[:, :, None], cos, sin)[:, :, 0]
    k = hf.apply_rotary(k[:, :, None], cos, sin)[:, :, 0]
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
    outs.append(probs @ v)
  attn = torch.cat(outs, dim=-1)
  after_attn = x + block.wo(attn)
  gate, up = (block.ffn_norm(after_attn) @ block.ffn.w12.weight.T).split(block.ffn.w3.weight.shape[1], dim=-1)
  want = after_attn + (torch.nn.functional.silu(gate) * up) @ block.ffn.w3.weight.T
  got, _ = block(x, cos, sin, None)
  torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope='module')
def tiny_lm():
  torch.manual_seed(0)
  return hf.NeoBERTLMHead(tiny_config()).eval()


def test_padding_does_not_change_real_tokens(tiny_lm):
  ids = torch.randint(1, 97, (2, 9))
  mask = torch.ones(2, 9, dtype=torch.long)
  mask[1, 5:] = 0
  with torch.no_grad():
    batched = tiny_lm(ids, attention_mask=mask).logits
    alone = tiny_lm(ids[1:, :5]).logits
  torch.testing.assert_close(batched[1, :5], alone[0], atol=1e-5, rtol=1e-5)


def test_packed_rows_equal_documents_one_by_one(tiny_lm):
  ids = torch.randint(1, 97, (1, 12))
  segments = torch.tensor([[1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 0, 0]])
  with torch.no_grad():
    packed = tiny_lm(ids, segment_ids=segments).logits
    by_cu = tiny_lm(ids[:, :10], cu_seqlens=torch.tensor([0, 4, 9, 10]), max_seqlen=5).logits
    for start, stop in ((0, 4), (4, 9), (9, 10)):
      alone = tiny_lm(ids[:, start:stop]).logits
      torch.testing.assert_close(packed[:, start:stop], alone, atol=1e-5, rtol=1e-5)
  assert torch.isfinite(packed).all()  # padding (segment 0) stays finite
  # Another mask layout of the same rows (per-document attention vs segment masking): float32 rounding of a
  # different summation, so the tolerance of the documents-alone comparison above.
  torch.testing.assert_close(by_cu, packed[:, :10], atol=1e-5, rtol=1e-5)


def test_positions_restart_per_segment():
  seg = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
  assert hf.positions_from_segment_ids(seg).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]
  assert hf.segment_ids_from_cu_seqlens(torch.tensor([0, 3, 5]), 7).tolist() == [1, 1, 1, 2, 2, 0, 0]
  with pytest.raises(ValueError, match='cu_seqlens'):
    hf.segment_ids_from_cu_seqlens(torch.tensor([1, 3]), 7)


def test_bad_inputs_are_named(tiny_lm):
  ids = torch.randint(1, 97, (2, 5))
  with pytest.raises(ValueError, match='attention_mask must have shape'):
    tiny_lm(ids, attention_mask=torch.ones(2, 4))
  with pytest.raises(ValueError, match='not both'):
    tiny_lm(ids[:1], segment_ids=torch.ones(1, 5), cu_seqlens=torch.tensor([0, 5]))
  with pytest.raises(ValueError, match=r'\[1, total\]'):
    tiny_lm(ids, cu_seqlens=torch.tensor([0, 5]))
  with pytest.raises(ValueError, match='dim_head'):
    hf.NeoBERTConfig(hidden_size=64, num_attention_heads=4, dim_head=32)


def test_sequence_classification_head(tiny_lm):
  config = tiny_config(num_labels=3)
  torch.manual_seed(1)
  clf = hf.NeoBERTForSequenceClassification(config).eval()
  clf.model.load_state_dict(tiny_lm.model.state_dict())
  ids = torch.randint(1, 97, (2, 7))
  with torch.no_grad():
    out = clf(ids, labels=torch.tensor([0, 2]))
    first = tiny_lm.model(ids).last_hidden_state[:, 0]
    want = clf.classifier(torch.tanh(clf.dense(first)))
  torch.testing.assert_close(out.logits, want)
  assert out.loss.ndim == 0 and torch.isfinite(out.loss)
  keys = set(clf.state_dict())
  assert {'dense.weight', 'dense.bias', 'classifier.weight', 'classifier.bias'} <= keys
  assert not any(k.startswith('decoder') for k in keys)


def padded_batch():
  ids = torch.randint(1, 97, (3, 9), generator=torch.Generator().manual_seed(3))
  mask = torch.ones(3, 9, dtype=torch.long)
  mask[0, 6:] = 0
  mask[2, :] = 0  # a row without tokens
  return ids, mask


def test_output_flags_fall_back_to_the_config_and_tuples_without_return_dict():
  torch.manual_seed(0)
  model = hf.NeoBERTLMHead(tiny_config(output_hidden_states=True, output_attentions=True)).eval()
  ids, mask = padded_batch()
  with torch.no_grad():
    out = model(ids, attention_mask=mask)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert model(ids, attention_mask=mask, output_attentions=False).attentions is None  # the call wins
    model.config.return_dict = False
    as_tuple = model(ids, attention_mask=mask)
  assert isinstance(as_tuple, tuple) and len(as_tuple) == 3
  torch.testing.assert_close(as_tuple[0], out.logits)


@pytest.mark.slow
def test_every_path_returns_the_same_whole_tensors_zero_at_padding():
  """Unpadded (sdpa), eager, the padded computation, torch.jit.trace and torch.export: equal on every position,
  padded ones (zeros) included."""
  torch.manual_seed(0)
  model = hf.NeoBERTLMHead(tiny_config()).eval()
  ids, mask = padded_batch()
  with torch.no_grad():
    want = model(ids, attention_mask=mask).logits
    model.config._attn_implementation = 'eager'
    eager = model(ids, attention_mask=mask).logits
    model.config._attn_implementation = 'sdpa'
    model.config.unpad_inputs = False
    padded = model(ids, attention_mask=mask).logits
    model.config.unpad_inputs = True
    model.config.return_dict = False
    traced = torch.jit.trace(model, (ids, mask))(ids, mask)[0]
    exported = torch.export.export(model, (ids, mask)).module()(ids, mask)[0]
  assert want[~mask.bool()].abs().max() == 0
  for got in (eager, padded, traced, exported):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_head_mask_attn_implementation_and_legacy_max_length(tmp_path):
  torch.manual_seed(0)
  model = hf.NeoBERTModel(tiny_config(max_length=128)).eval()
  assert model.config.max_position_embeddings == 128
  ids, mask = padded_batch()
  head_mask = torch.ones(2, 4)
  head_mask[0, 1] = 0
  with torch.no_grad():
    out = model(ids, attention_mask=mask, head_mask=head_mask, output_attentions=True)
  assert out.attentions[0][:, 1].abs().max() == 0 and out.attentions[0][:, 0].abs().max() > 0
  with pytest.raises(ValueError, match=r'head_mask must have shape \(4,\) or \(2, 4\)'):
    model(ids, head_mask=torch.ones(3))
  model.save_pretrained(tmp_path)
  saved = (tmp_path / 'config.json').read_text()
  assert '"max_position_embeddings": 128' in saved and '"max_length"' not in saved  # 5.x refuses to save it
  assert hf.NeoBERTModel.from_pretrained(tmp_path, attn_implementation='eager').config._attn_implementation == 'eager'
  with pytest.raises(ValueError, match='Flash Attention'):
    hf.NeoBERTModel.from_pretrained(tmp_path, attn_implementation='flash_attention_2')
