"""`convert to-pytorch --model-type eurobert`: transformers' own EuroBERT layout, loaded without remote code.

Fast: the directory holds no Python and no auto_map, and from-pytorch reads it back into the very parameters it
came from (every layout: biases, tied decoder); the RoPE row permutation turns NeoBERT's adjacent-pair rotation
into EuroBERT's rotate-half with equal attention scores. Slow: under the newest transformers (5.24.0, the
environment tests/test_convert_transformers5.py installs), AutoModelForMaskedLM loads the EuroBERT export with
trust_remote_code off (transformers' own EuroBertForMaskedLM) and the NeoBERT export through model.py; on a padded
batch their logits and hidden states agree within 1e-4 on every real token. The pinned 4.57 refuses the EuroBERT
directory (no such model type before transformers 5.3).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from neobert_jax.convert import export_hf
from neobert_jax.convert.hf_modeling import model as hf_model
from neobert_jax.weights import eurobert, hf
import test_convert_export
import test_convert_onnx
import test_convert_transformers5
from neobert_jax.jobs import convert as convert_job
from test_convert_export import run_job

bert_tokenizer = test_convert_export.bert_tokenizer  # the module fixture
TOLERANCE = 1e-4  # the bound, absolute, on logits and hidden states of the real tokens
LAYOUTS = {'released': (False, False), 'biases_tied': (True, True)}


def random_flat(use_bias: bool, tied: bool, seed: int = 0):
  cfg = test_convert_onnx.small_config()
  cfg.use_bias, cfg.tie_word_embeddings = use_bias, tied
  rng = np.random.default_rng(seed)
  state = {k: rng.normal(0, 0.2, shape).astype(np.float32) for k, shape in hf.hf_shapes(cfg).items()}
  return cfg, hf.hf_state_dict_to_flat(state, cfg)


@pytest.mark.parametrize('layout', sorted(LAYOUTS))
def test_the_eurobert_directory_needs_no_code_and_reads_back_exactly(layout, bert_tokenizer, tmp_path, capsys):
  cfg, flat = random_flat(*LAYOUTS[layout])
  out = export_hf.export_flat(flat, cfg, tmp_path / 'eb', tokenizer=bert_tokenizer, model_type='eurobert')
  assert not list(out.glob('*.py'))  # nothing to trust: transformers' own classes
  config = json.loads((out / 'config.json').read_text())
  assert config['model_type'] == 'eurobert' and 'auto_map' not in config
  assert config['architectures'] == ['EuroBertForMaskedLM']
  assert (config['bos_token_id'], config['eos_token_id'], config['mask_token_id']) == (101, 102, 103)
  assert config['attention_bias'] is cfg.use_bias and config['mlp_bias'] is True  # the head's bias needs it
  code, text = run_job(capsys, convert_job.from_pytorch, out, tmp_path / 'back.safetensors')
  assert code == 0, text
  back_cfg, back = hf.read_hf_dir(out)
  assert (back_cfg.use_bias, back_cfg.tie_word_embeddings) == (cfg.use_bias, cfg.tie_word_embeddings)
  assert back.keys() == flat.keys()
  for key in flat:
    np.testing.assert_array_equal(back[key], flat[key], err_msg=key)


def test_to_onnx_reads_the_eurobert_directory_as_the_neobert_one(tmp_path):
  from neobert_jax.convert import onnx_export

  cfg, flat = random_flat(True, False)
  neo = export_hf.export_flat(flat, cfg, tmp_path / 'neo')
  eb = export_hf.export_flat(flat, cfg, tmp_path / 'eb', model_type='eurobert')
  ids, mask = (torch.from_numpy(x) for x in test_convert_onnx.batch([5, 9], 9))
  with torch.no_grad():
    want = onnx_export.load_exported(neo, 'mlm')[0](ids, mask)
    got = onnx_export.load_exported(eb, 'mlm')[0](ids, mask)
  torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same weights after the translation back


def test_nonzero_feed_forward_biases_without_attention_biases_are_refused(tmp_path):
  cfg, flat = random_flat(False, False)
  state, config = eurobert.from_neobert(hf.flat_to_hf_state_dict(flat, cfg), hf.hf_config_dict(cfg), {})
  state['model.layers.0.mlp.up_proj.bias'] = np.ones_like(state['model.layers.0.mlp.up_proj.bias'])
  with pytest.raises(Exception, match='one switch for both'):
    eurobert.to_neobert(config, state)
  with pytest.raises(Exception, match='num_key_value_heads'):
    eurobert.to_neobert({**config, 'num_key_value_heads': 1}, state)


def test_permuted_rows_rotate_half_as_neobert_rotates_pairs():
  """q.k of the split, permuted projections under rotate-half RoPE equals NeoBERT's under adjacent-pair RoPE."""
  cfg, flat = random_flat(True, False)
  neo = hf.flat_to_hf_state_dict(flat, cfg)
  state, _ = eurobert.from_neobert(neo, hf.hf_config_dict(cfg), {})
  heads, dim = cfg.num_heads, cfg.hidden_size
  head_dim = dim // heads
  x = torch.randn(5, dim)
  cos, sin = hf_model.rotary_cos_sin(torch.arange(5), head_dim, cfg.rope_theta)  # [T, Dh/2]
  qkv = torch.from_numpy(neo['model.transformer_encoder.0.qkv.weight']) @ x.T
  qkv = qkv.T + torch.from_numpy(neo['model.transformer_encoder.0.qkv.bias'])
  q, k, _ = qkv.view(5, heads, 3 * head_dim).chunk(3, dim=-1)
  q, k = (hf_model.apply_rotary(t[None], cos[None], sin[None])[0] for t in (q, k))
  want = torch.einsum('thd,shd->hts', q, k)

  def rotate_half(name):
    t = x @ torch.from_numpy(state[f'model.layers.0.self_attn.{name}_proj.weight']).T
    t = (t + torch.from_numpy(state[f'model.layers.0.self_attn.{name}_proj.bias'])).view(5, heads, head_dim)
    c, s = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    half = torch.cat([-t[..., head_dim // 2 :], t[..., : head_dim // 2]], -1)
    return t * c + half * s

  got = torch.einsum('thd,shd->hts', rotate_half('q'), rotate_half('k'))
  torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


SCRIPT = textwrap.dedent(
  """
  import json, sys
  import torch, transformers
  from transformers import AutoModelForMaskedLM, AutoTokenizer
  out_file, dirs = sys.argv[1], sys.argv[2:]
  texts = ['hello world', 'a longer sentence about the football league', 'one']
  out = {'transformers': transformers.__version__, 'layouts': []}
  for neo_dir, eb_dir in zip(dirs[::2], dirs[1::2]):
    try:
      tok = AutoTokenizer.from_pretrained(eb_dir)
      eb = AutoModelForMaskedLM.from_pretrained(eb_dir, trust_remote_code=False).eval()
    except (ValueError, KeyError, OSError) as e:
      out['refused'] = str(e)[:300]
      break
    neo = AutoModelForMaskedLM.from_pretrained(neo_dir, trust_remote_code=True).eval()
    enc = tok(texts, padding=True, return_tensors='pt')
    real = enc['attention_mask'].bool()
    with torch.no_grad():
      a = eb(**enc, output_hidden_states=True)
      b = neo(**enc, output_hidden_states=True)
      last = neo.model(**enc).last_hidden_state
    # EuroBERT's last hidden state is after the final norm (last_hidden_state); NeoBERT's is the last block's.
    want = list(b.hidden_states[:-1]) + [last]
    out['layouts'].append({
      'class': type(eb).__module__ + '.' + type(eb).__name__,
      'padded': [int(real.sum()), real.numel()],
      'logits': [a.logits[real].tolist(), b.logits[real].tolist()],
      'hidden': [[x[real].tolist() for x in a.hidden_states], [x[real].tolist() for x in want]],
    })
  json.dump(out, open(out_file, 'w'))
  """
)


def run_script(python, dirs, tmp_path, name) -> dict:
  (tmp_path / 'load.py').write_text(SCRIPT)
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  env.update(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', HF_HOME=str(tmp_path / 'hf_home'))
  out = tmp_path / f'{name}.json'
  run = subprocess.run(
    [str(python), 'load.py', str(out), *map(str, dirs)],
    cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(out.read_text())


@pytest.mark.slow
def test_eurobert_export_under_transformers5_equals_the_neobert_export(bert_tokenizer, tmp_path):
  dirs, configs = [], []
  for layout in sorted(LAYOUTS):
    cfg, flat = random_flat(*LAYOUTS[layout])
    dirs.append(export_hf.export_flat(flat, cfg, tmp_path / layout / 'neo', tokenizer=bert_tokenizer))
    dirs.append(
      export_hf.export_flat(flat, cfg, tmp_path / layout / 'eb', tokenizer=bert_tokenizer, model_type='eurobert')
    )
    configs.append(cfg)
  newest = run_script(test_convert_transformers5.newest_env(), dirs, tmp_path, 'newest')
  assert newest['transformers'] == test_convert_transformers5.NEWEST[0].split('==')[1]
  assert 'refused' not in newest, newest.get('refused')
  assert len(newest['layouts']) == len(LAYOUTS)
  for cfg, result in zip(configs, newest['layouts']):
    assert result['class'] == 'transformers.models.eurobert.modeling_eurobert.EuroBertForMaskedLM'
    real, total = result['padded']
    assert real < total  # a padded batch
    got, want = (np.asarray(x) for x in result['logits'])
    assert got.shape == want.shape == (real, cfg.vocab_size)
    assert np.abs(got - want).max() <= TOLERANCE
    got, want = (np.asarray(x) for x in result['hidden'])
    assert got.shape == want.shape == (cfg.num_layers + 1, real, cfg.hidden_size)
    assert np.abs(got - want).max() <= TOLERANCE
  # The pinned 4.57 has no EuroBERT: it refuses the directory in one line.
  pinned = run_script(sys.executable, dirs[:2], tmp_path, 'pinned')
  assert pinned['transformers'].startswith('4.') and 'eurobert' in pinned['refused']
