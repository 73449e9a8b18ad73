"""Flat params <-> Hugging Face state_dict mapping (pure numpy) and config translation (weights/hf.py, weights/flat.py)."""

import numpy as np
import pytest

from neobert_jax import errors
from neobert_jax.config.model import default_model_config
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import hf as hf_lib


def small_config():
  cfg = default_model_config()
  cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size = 50, 32, 3, 4, 64
  return cfg


def random_flat(cfg, seed=0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal(s).astype(dtype) for k, s in flat_lib.flat_shapes(cfg).items()}


def test_round_trip_is_bit_exact():
  cfg = small_config()
  flat = random_flat(cfg)
  sd = hf_lib.flat_to_hf_state_dict(flat, cfg)
  assert {k: v.shape for k, v in sd.items()} == hf_lib.hf_shapes(cfg)
  back = hf_lib.hf_state_dict_to_flat(sd, cfg)
  assert back.keys() == flat.keys()
  for key in flat:
    assert back[key].dtype == flat[key].dtype
    np.testing.assert_array_equal(back[key], flat[key], err_msg=key)


def test_layout_conventions():
  """qkv rows grouped per head (q|k|v), w12's first F rows are the gate, Linear weights are [out, in]."""
  cfg = small_config()
  d = flat_lib.Dims.from_config(cfg)
  flat = random_flat(cfg, seed=1)
  sd = hf_lib.flat_to_hf_state_dict(flat, cfg)
  layer, head = 2, 1
  qkv = sd[f'model.transformer_encoder.{layer}.qkv.weight']
  rows = qkv[3 * d.head_dim * head : 3 * d.head_dim * (head + 1)]
  np.testing.assert_array_equal(rows[: d.head_dim], flat['encoder.layers.qkv'][layer, :, head, : d.head_dim].T)
  np.testing.assert_array_equal(rows[2 * d.head_dim :], flat['encoder.layers.qkv'][layer, :, head, 2 * d.head_dim :].T)
  w12 = sd[f'model.transformer_encoder.{layer}.ffn.w12.weight']
  np.testing.assert_array_equal(w12[: d.ffn], flat['encoder.layers.w12'][layer, :, 0, :].T)
  wo = sd[f'model.transformer_encoder.{layer}.wo.weight']
  np.testing.assert_array_equal(wo[:, head * d.head_dim], flat['encoder.layers.wo'][layer, head, 0, :])
  np.testing.assert_array_equal(sd['decoder.weight'], flat['decoder.kernel'].T)


def test_base_model_keys_and_buffers_are_accepted():
  cfg = small_config()
  sd = hf_lib.flat_to_hf_state_dict(random_flat(cfg), cfg)
  base = {(k[len('model.') :] if k.startswith('model.') else k): v for k, v in sd.items()}
  base['freqs_cis'] = np.zeros(3)
  flat = hf_lib.hf_state_dict_to_flat(base, cfg)
  np.testing.assert_array_equal(flat['encoder.final_norm'], sd['model.layer_norm.weight'])


def test_errors_name_key_shapes_and_fix():
  cfg = small_config()
  flat = random_flat(cfg)
  sd = hf_lib.flat_to_hf_state_dict(flat, cfg)
  bad = dict(sd)
  del bad['model.transformer_encoder.1.wo.weight']
  bad['model.pooler.weight'] = np.zeros(2)
  bad['decoder.bias'] = np.zeros(7)
  with pytest.raises(errors.ExportError) as err:
    hf_lib.hf_state_dict_to_flat(bad, cfg)
  msg = str(err.value)
  assert 'missing keys (1): model.transformer_encoder.1.wo.weight' in msg
  assert 'unexpected keys (1): model.pooler.weight' in msg
  assert 'decoder.bias: expected shape (50,), got (7,)' in msg
  assert 'Fix:' in msg

  wrong = small_config()
  wrong.num_layers = 2
  with pytest.raises(
    errors.ExportError, match=r'encoder.layers.qkv: expected shape \(2, 32, 4, 24\), got \(3, 32, 4, 24\)'
  ):
    hf_lib.flat_to_hf_state_dict(flat, wrong)


def test_config_round_trip():
  cfg = small_config()
  cfg.norm_eps, cfg.max_length, cfg.rope_theta = 1e-6, 4096, 500.0
  hf = hf_lib.hf_config_dict(cfg)
  assert hf['model_type'] == 'neobert' and hf['architectures'] == ['NeoBERTLMHead']
  assert hf['auto_map']['AutoModelForMaskedLM'] == 'model.NeoBERTLMHead'
  assert (hf['num_hidden_layers'], hf['num_attention_heads'], hf['dim_head']) == (3, 4, 8)
  back = hf_lib.model_config_from_hf(hf)
  for field in (
    'vocab_size',
    'hidden_size',
    'num_layers',
    'num_heads',
    'intermediate_size',
    'norm_eps',
    'max_length',
    'rope_theta',
    'pad_token_id',
  ):
    assert back[field] == cfg[field], field


def test_config_errors():
  with pytest.raises(errors.ExportError, match="model_type='bert'"):
    hf_lib.model_config_from_hf({'model_type': 'bert'})
  with pytest.raises(errors.ExportError, match='lacks'):
    hf_lib.model_config_from_hf({'model_type': 'neobert', 'hidden_size': 8})
  hf = hf_lib.hf_config_dict(small_config())
  with pytest.raises(errors.ExportError, match="'hidden_act': 'gelu'"):
    hf_lib.model_config_from_hf({**hf, 'hidden_act': 'gelu', 'rope': True})
  hf_lib.model_config_from_hf({**hf, 'hidden_act': 'SwiGLU', 'rope': True, 'rms_norm': True, 'ngpt': False})
  hf['dim_head'] = 16
  with pytest.raises(errors.ExportError, match='dim_head=16'):
    hf_lib.model_config_from_hf(hf)


def test_sequence_length_is_written_as_max_position_embeddings_and_read_from_max_length_too():
  """transformers 5 takes max_length for a generation parameter: written under max_position_embeddings, and read
  from max_length in exports written before (and in the published chandar-lab/NeoBERT config)."""

  written = hf_lib.hf_config_dict(default_model_config())
  assert 'max_length' not in written and written['max_position_embeddings'] == default_model_config().max_length
  legacy = {k: v for k, v in written.items() if k != 'max_position_embeddings'}
  assert hf_lib.model_config_from_hf({**legacy, 'max_length': 4096}).max_length == 4096
  assert hf_lib.max_positions({**legacy, 'max_length': 4096}) == 4096
