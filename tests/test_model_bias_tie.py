"""The two layout fields off NeoBERT's defaults, model.use_bias and model.tie_word_embeddings: the parameters each
adds or removes (weights/flat.py), what they do to the output and the gradient, the exported PyTorch model (loaded
by transformers with remote code) against JAX, and export -> import.

Tolerances: the JAX and PyTorch models compute the same float32 math in different summation orders; at this size
(width 32, two blocks, weights ~0.2) the logits are O(1) and differ by float32 rounding, ~1e-6 (measured: 3e-7), so
1e-5 on either vendor's CPU. A broken bias or tie is an O(0.1) change.
"""

import json
import os
import subprocess

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file

from neobert_jax import config as config_lib
from neobert_jax import errors, sharding
from neobert_jax.config.model import default_model_config, validate_model_config
from neobert_jax.convert import export_hf
from neobert_jax.jobs import convert as convert_job
from neobert_jax.engine.optimizer import decays, weight_decay_mask
from neobert_jax.model import NeoBERTForMLM
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import hf
from neobert_jax.weights.flat import path_names, to_flat
from tests.support.tiny_train import model_from_flat
from tests.support.torch_reference import padded_reference_forward

VOCAB = 97
FLAGS = [(True, False), (False, True), (True, True)]  # (use_bias, tie_word_embeddings)
NAMES = ['bias', 'tied', 'bias+tied']
# The released layout: what a default config must keep (the published checkpoint's keys).
RELEASED_KEYS = {
  'encoder.token_embedding.embedding',
  'encoder.layers.attention_norm',
  'encoder.layers.qkv',
  'encoder.layers.wo',
  'encoder.layers.ffn_norm',
  'encoder.layers.w12',
  'encoder.layers.w3',
  'encoder.final_norm',
  'decoder.kernel',
  'decoder.bias',
}
# model.use_bias: each bias, its shape and its logical axes (the kernel's output axes), for L=2, H=4, Dh=8, F=32.
BIASES = {
  'qkv_bias': ((2, 4, 24), ('layers', 'heads', 'head_dim')),
  'wo_bias': ((2, 32), ('layers', 'embed')),
  'w12_bias': ((2, 2, 32), ('layers', None, 'mlp')),
  'w3_bias': ((2, 32), ('layers', 'embed')),
}


def small_config(use_bias=False, tie=False):
  cfg = default_model_config()
  cfg.update(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_length=64)
  cfg.use_bias, cfg.tie_word_embeddings = use_bias, tie
  return cfg


def random_flat(cfg, seed=0):
  """Every parameter random (biases and norm scales included), at a scale where attention is not uniform."""
  rng = np.random.default_rng(seed)
  return {k: rng.normal(0, 0.2, s).astype(np.float32) for k, s in flat_lib.flat_shapes(cfg).items()}


def padded_rows(seed=0):
  """ids [3, 9] with padding (lengths 9, 5, 1), the lengths and the [3, 9] mask of real tokens."""
  rng = np.random.default_rng(seed)
  lengths = np.array([9, 5, 1], np.int32)
  mask = np.arange(9)[None] < lengths[:, None]
  return np.where(mask, rng.integers(1, VOCAB, (3, 9)), 0).astype(np.int32), lengths, mask


def jax_model(cfg, flat):
  return model_from_flat(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)), flat)


def test_default_layout_is_the_released_one():
  cfg = default_model_config()
  assert cfg.use_bias is False and cfg.tie_word_embeddings is False
  assert set(flat_lib.flat_shapes(cfg)) == RELEASED_KEYS
  assert not any(k.endswith('.bias') and 'transformer_encoder' in k for k in hf.hf_shapes(cfg))
  config = hf.hf_config_dict(cfg)
  assert (config['attention_bias'], config['mlp_bias'], config['tie_word_embeddings']) == (False, False, False)


@pytest.mark.parametrize('use_bias, tie', FLAGS, ids=NAMES)
def test_parameters_follow_the_flags(use_bias, tie):
  cfg = small_config(use_bias, tie)
  model = NeoBERTForMLM(cfg, rngs=nnx.Rngs(0))
  flat = to_flat(model)
  assert {k: v.shape for k, v in flat.items()} == flat_lib.flat_shapes(cfg)
  assert ('decoder.kernel' in flat) == (not tie) and 'decoder.bias' in flat
  layers = model.encoder.layers
  for name, (shape, axes) in BIASES.items():
    assert hasattr(layers, name) == use_bias, name
    if use_bias:
      assert flat[f'encoder.layers.{name}'].shape == shape and not flat[f'encoder.layers.{name}'].any(), name
      assert getattr(layers, name).get_metadata()['out_sharding'] == axes, name
      assert not decays(['encoder', 'layers', name]), name  # biases take no weight decay, as the decoder's
  assert decays(['encoder', 'layers', 'qkv']) and not decays(['decoder', 'bias'])
  # Without biases the shapes and initial values are NeoBERT's: the flags add or drop parameters, nothing else.
  plain = to_flat(NeoBERTForMLM(small_config(), rngs=nnx.Rngs(0)))
  for key, value in flat.items():
    if key in plain:
      np.testing.assert_array_equal(value, plain[key], err_msg=key)


@pytest.mark.slow
def test_biases_are_placed_like_their_kernels_outputs():
  """On a data x fsdp x tensor mesh each bias takes the sharding its axes name in the one rules table."""
  cfg = small_config(True, True)
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
  with sharding.activate(mesh):
    model = nnx.jit(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)))()
    for name, (shape, axes) in BIASES.items():
      expected = jax.sharding.NamedSharding(mesh, sharding.logical_to_spec(axes))
      assert getattr(model.encoder.layers, name)[...].sharding.is_equivalent_to(expected, len(shape)), name
    # The heads of qkv's output split over tensor, as qkv's; wo's and w3's output width over fsdp, as theirs.
    assert tuple(sharding.logical_to_spec(BIASES['qkv_bias'][1]))[:2] == (None, 'tensor')
    assert tuple(sharding.logical_to_spec(BIASES['wo_bias'][1])) == (None, 'fsdp')


def test_zero_biases_are_neobert_and_each_bias_changes_the_output():
  ids, lengths, mask = padded_rows()
  biased = random_flat(small_config(use_bias=True))
  for key in BIASES:
    biased[f'encoder.layers.{key}'] = np.zeros_like(biased[f'encoder.layers.{key}'])
  plain = {k: v for k, v in biased.items() if k.split('.')[-1] not in BIASES}
  want = np.asarray(jax_model(small_config(), plain)(ids, lengths=lengths))
  np.testing.assert_array_equal(np.asarray(jax_model(small_config(use_bias=True), biased)(ids, lengths=lengths)), want)
  for key in BIASES:
    one = dict(biased)
    one[f'encoder.layers.{key}'] = np.full_like(one[f'encoder.layers.{key}'], 0.5)
    got = np.asarray(jax_model(small_config(use_bias=True), one)(ids, lengths=lengths))
    assert np.abs(got - want)[mask].max() > 1e-2, key


@pytest.mark.slow
def test_tied_decoder_reads_the_embedding_and_trains_it():
  cfg = small_config(tie=True)
  flat = random_flat(cfg)
  model = jax_model(cfg, flat)
  ids, lengths, mask = padded_rows()
  hidden = np.asarray(model.encoder(ids, lengths=lengths))
  want = hidden @ flat['encoder.token_embedding.embedding'].T + flat['decoder.bias']
  np.testing.assert_allclose(np.asarray(model(ids, lengths=lengths)), want, atol=1e-5, rtol=0)

  # Rows of tokens absent from the input get no gradient through the lookup: whatever they get comes through the
  # decoder. One SGD step must move them when tied, and must not when untied.
  unused = np.setdiff1d(np.arange(VOCAB), ids)
  assert unused.size > 30

  def step(model):
    loss = lambda m: jnp.mean(jax.nn.log_softmax(m(ids, lengths=lengths))[..., 7])
    grads = nnx.grad(loss)(model)
    before = np.asarray(model.encoder.token_embedding.embedding[...])
    after = before - 1.0 * np.asarray(grads.encoder.token_embedding.embedding[...])
    return np.abs(after - before)[unused].max()

  assert step(model) > 1e-4
  untied = small_config()
  assert step(jax_model(untied, {**random_flat(untied), **flat})) == 0.0


@pytest.fixture(scope='module', params=FLAGS, ids=NAMES)
def exported(request, tmp_path_factory):
  """(cfg, flat, export directory) of a random model with the flags on."""
  cfg = small_config(*request.param)
  flat = random_flat(cfg)
  name = 'hf-' + '-'.join(n for n, on in zip(('bias', 'tied'), request.param) if on)  # one remote-code module each
  return cfg, flat, export_hf.export_flat(flat, cfg, tmp_path_factory.mktemp('export') / name)


def test_export_carries_the_flags_and_round_trips(exported, tmp_path):
  cfg, flat, out = exported
  config = json.loads((out / 'config.json').read_text())
  assert config['attention_bias'] == config['mlp_bias'] == cfg.use_bias
  assert config['tie_word_embeddings'] == cfg.tie_word_embeddings
  weights = load_file(str(out / 'model.safetensors'))
  assert {k: v.shape for k, v in weights.items()} == hf.hf_shapes(cfg)
  assert ('decoder.weight' in weights) == (not cfg.tie_word_embeddings)
  assert ('model.transformer_encoder.1.ffn.w12.bias' in weights) == cfg.use_bias
  cfg2, flat2 = hf.read_hf_dir(out)
  assert (cfg2.use_bias, cfg2.tie_word_embeddings) == (cfg.use_bias, cfg.tie_word_embeddings)
  assert flat2.keys() == flat.keys()
  for key in flat:
    np.testing.assert_array_equal(flat2[key], flat[key], err_msg=key)
  convert_job.save_flat(flat2, cfg2, tmp_path / 'p.safetensors')  # the flat-params file checks the same layout
  cfg3, flat3 = flat_lib.load_saved_flat(tmp_path / 'p.safetensors')
  assert cfg3.to_dict() == cfg2.to_dict() and flat3.keys() == flat.keys()


def test_transformers_model_equals_jax(exported, tmp_path):
  from transformers import AutoModelForMaskedLM

  cfg, flat, out = exported
  mlm = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True, local_files_only=True).eval()
  assert (mlm.decoder.weight is mlm.model.encoder.weight) == cfg.tie_word_embeddings
  assert (mlm.model.transformer_encoder[0].wo.bias is not None) == cfg.use_bias
  ids, lengths, mask = padded_rows()
  with torch.no_grad():
    got = mlm(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long()).logits.numpy()
    # The original padded computation (support/torch_reference.py: the weights, none of model.py's forward code).
    reference = padded_reference_forward(mlm.model, torch.from_numpy(ids).long(), torch.from_numpy(mask))
    reference = mlm.decoder(reference).numpy()
  want = np.asarray(jax_model(cfg, flat)(ids, lengths=lengths))
  assert np.abs(want[mask]).max() > 0.5  # logits of unit scale: the tolerance below is relative to O(1)
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-5, rtol=0)
  np.testing.assert_allclose(reference[mask], want[mask], atol=1e-5, rtol=0)
  # transformers' own save (a tied model drops decoder.weight) reads back into the same flat params.
  mlm.save_pretrained(tmp_path / 'saved')
  _, again = hf.read_hf_dir(tmp_path / 'saved')
  for key in flat:
    np.testing.assert_array_equal(again[key], flat[key], err_msg=key)


def test_bad_values_are_one_clear_line():
  loose = ml_collections.ConfigDict(small_config().to_dict(), type_safe=False)
  loose.use_bias = 'yes'
  with pytest.raises(ValueError) as err:
    NeoBERTForMLM(loose, rngs=nnx.Rngs(0))
  assert str(err.value) == "model.use_bias='yes' must be True or False."
  loose.use_bias, loose.tie_word_embeddings = False, 1
  with pytest.raises(ValueError, match=r'^model.tie_word_embeddings=1 must be True or False.$'):
    validate_model_config(loose)
  # A recorded or command-line value is typed by the schema first.
  with pytest.raises(errors.ConfigError, match='use_bias') as err:
    config_lib.from_record({'use_bias': 'yes'}, default_model_config())
  assert '\n' not in str(err.value)
  # config.json: a flag that is not a boolean, and biases on one kind of Linear only.
  base = hf.hf_config_dict(small_config())
  with pytest.raises(errors.ExportError, match=r"attention_bias='yes'; expected true or false"):
    hf.model_config_from_hf({**base, 'attention_bias': 'yes', 'mlp_bias': 'yes'})
  with pytest.raises(errors.ExportError, match='one switch for both') as err:
    hf.model_config_from_hf({**base, 'attention_bias': True})
  assert '\n' not in str(err.value)
  # Weights of one layout with a config of the other: every difference named, and the fields in the fix.
  with pytest.raises(errors.ExportError, match='unexpected keys \\(1\\): decoder.kernel') as err:
    flat_lib.check_flat(random_flat(small_config()), small_config(tie=True))
  assert 'tie_word_embeddings' in str(err.value)


def test_a_tied_state_dict_with_both_names_reads_when_they_agree():
  """A pytorch_model.bin of a tied model holds decoder.weight too: read when it is the embedding, else refused."""
  cfg = small_config(tie=True)
  flat = random_flat(cfg)
  sd = hf.flat_to_hf_state_dict(flat, cfg)
  both = {**sd, 'decoder.weight': sd['model.encoder.weight'].copy()}
  back = hf.hf_state_dict_to_flat(both, cfg)
  np.testing.assert_array_equal(back['encoder.token_embedding.embedding'], flat['encoder.token_embedding.embedding'])
  with pytest.raises(errors.ExportError, match='unexpected keys \\(1\\): decoder.weight'):
    hf.hf_state_dict_to_flat({**both, 'decoder.weight': both['decoder.weight'] + 1}, cfg)


NEWEST_SCRIPT = """
import json, sys, tempfile
import numpy as np, torch, transformers
from transformers import AutoModelForMaskedLM
inputs = np.load(sys.argv[1])
ids, mask = torch.from_numpy(inputs['ids']).long(), torch.from_numpy(inputs['mask']).long()
out = {'transformers': transformers.__version__}
for path in sys.argv[3:]:
  mlm = AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True, local_files_only=True).eval()
  with tempfile.TemporaryDirectory() as tmp:  # transformers' own save, loaded again
    mlm.save_pretrained(tmp)
    again = AutoModelForMaskedLM.from_pretrained(tmp, trust_remote_code=True, local_files_only=True).eval()
  with torch.no_grad():
    logits = [m(input_ids=ids, attention_mask=mask).logits.tolist() for m in (mlm, again)]
  out[path] = {'logits': logits, 'tied': [m.decoder.weight is m.model.encoder.weight for m in (mlm, again)],
               'biased': mlm.model.transformer_encoder[0].ffn.w3.bias is not None}
json.dump(out, open(sys.argv[2], 'w'))
"""


@pytest.mark.slow
def test_exports_load_alike_under_the_newest_transformers(tmp_path_factory, tmp_path):
  """5.x ties through _tied_weights_keys alone (4.x also through get_output_embeddings): the same logits, the
  decoder tied to the embedding after loading and after its own save_pretrained."""
  import test_convert_transformers5 as t5

  python = t5.newest_env()  # skips without the package index
  cases = []
  for use_bias, tie in FLAGS:
    cfg = small_config(use_bias, tie)
    flat = random_flat(cfg, seed=1)
    out = tmp_path_factory.mktemp('newest') / f'hf-{int(use_bias)}{int(tie)}'
    cases.append((cfg, flat, export_hf.export_flat(flat, cfg, out)))
  ids, lengths, mask = padded_rows(seed=1)
  np.savez(tmp_path / 'inputs.npz', ids=ids, mask=mask.astype(np.int64))
  (tmp_path / 'load.py').write_text(NEWEST_SCRIPT)
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  env.update(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', HF_HOME=str(tmp_path / 'hf_home'))
  argv = [str(python), str(tmp_path / 'load.py'), str(tmp_path / 'inputs.npz'), str(tmp_path / 'out.json')]
  run = subprocess.run(
    argv + [str(c[2]) for c in cases], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
  )
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((tmp_path / 'out.json').read_text())
  assert result['transformers'].startswith('5.')
  for cfg, flat, out in cases:
    got = result[str(out)]
    assert got['tied'] == [cfg.tie_word_embeddings] * 2 and got['biased'] == cfg.use_bias
    want = np.asarray(jax_model(cfg, flat)(ids, lengths=lengths))
    for logits in got['logits']:
      np.testing.assert_allclose(np.asarray(logits)[mask], want[mask], atol=1e-5, rtol=0)


def test_the_optimizer_mask_on_the_model_state_spares_biases_and_norms():
  # The mask runs on nnx State, whose paths end in the Variable's 'value': the rule must still read the names.
  model = NeoBERTForMLM(small_config(use_bias=True, tie=False), rngs=nnx.Rngs(0))
  mask = weight_decay_mask(True)(nnx.state(model, nnx.Param))
  got = {'.'.join(path_names(p)).removesuffix('.value'): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}
  spared = sorted(k for k, v in got.items() if not v)
  assert spared == sorted(
    ['decoder.bias', 'encoder.final_norm', *(f'encoder.layers.{n}' for n in ('attention_norm', 'ffn_norm', *BIASES))]
  ), spared
