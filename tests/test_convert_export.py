"""HF export/import: directory contents, loading with transformers (remote code, offline) in a fresh process,
logits against JAX, training-checkpoint source, atomic/overwrite behaviour and the CLI's error cases."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from neobert_jax import errors
from neobert_jax.convert import export_hf
from neobert_jax.convert.hf_modeling import MODELING_FILES
from neobert_jax.jobs import convert as convert_job
from neobert_jax.model import NeoBERTForMLM, default_model_config
from neobert_jax.weights import hf
from neobert_jax.weights.flat import load_saved_flat, to_flat
from tests.support.commands import reported
from tests.support.tiny_train import model_from_flat

REPO = Path(__file__).resolve().parents[1]


def small_config():
  cfg = default_model_config()
  cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size = 64, 2, 4, 128
  cfg.max_length = 512
  return cfg


@pytest.fixture(scope='module')
def source():
  """A small model (bert vocab) with non-trivial norm scales and decoder bias."""
  cfg = small_config()
  flat = to_flat(NeoBERTForMLM(cfg, rngs=nnx.Rngs(3)))
  rng = np.random.default_rng(0)
  for key in ('encoder.layers.attention_norm', 'encoder.layers.ffn_norm', 'encoder.final_norm', 'decoder.bias'):
    flat[key] = (flat[key] + rng.normal(0, 0.2, flat[key].shape)).astype(np.float32)
  flat['encoder.layers.qkv'] = flat['encoder.layers.qkv'] * 20  # sharper attention than the tiny init gives
  return cfg, flat


@pytest.fixture(scope='module')
def bert_tokenizer():
  from neobert_jax.data import assets

  try:
    return assets.bert_tokenizer_file()
  except errors.DownloadError as e:
    pytest.skip(f'bert-base-uncased vocabulary not available from the package registry: {e}')


@pytest.fixture(scope='module')
def exported(tmp_path_factory, source, bert_tokenizer):
  cfg, flat = source
  out = tmp_path_factory.mktemp('export') / 'hf'
  export_hf.export_flat(flat, cfg, out, tokenizer=bert_tokenizer)
  return out


def test_export_directory_contents(exported, source):
  cfg, flat = source
  assert sorted(p.name for p in exported.iterdir()) == [
    'README.md',  # the model card
    'config.json',
    'layers.py',
    'model.py',
    'model.safetensors',
    'special_tokens_map.json',
    'tokenizer.json',
    'tokenizer_config.json',
    'unpadding.py',
    'vocab.txt',
  ]
  for modeling_file in MODELING_FILES:
    assert (exported / modeling_file.name).read_bytes() == modeling_file.read_bytes()
  assert 'max_length' not in json.loads((exported / 'config.json').read_text())  # a generation parameter to 5.x
  config = json.loads((exported / 'config.json').read_text())
  assert config['model_type'] == 'neobert'
  assert config['architectures'] == ['NeoBERTLMHead']
  assert config['auto_map'] == {
    'AutoConfig': 'model.NeoBERTConfig',
    'AutoModel': 'model.NeoBERTModel',
    'AutoModelForMaskedLM': 'model.NeoBERTLMHead',
    'AutoModelForSequenceClassification': 'model.NeoBERTForSequenceClassification',
  }
  for key, value in {
    'hidden_size': 64,
    'num_hidden_layers': 2,
    'num_attention_heads': 4,
    'intermediate_size': 128,
    'dim_head': 16,
    'norm_eps': 1e-5,
    'vocab_size': 30522,
    'pad_token_id': 0,
    'max_position_embeddings': 512,
    'embedding_init_range': 0.02,
    'decoder_init_range': 0.02,
    'classifier_init_range': 0.02,
    'torch_dtype': 'float32',
  }.items():
    assert config[key] == value, key
  weights = load_file(str(exported / 'model.safetensors'))
  assert {k: v.shape for k, v in weights.items()} == hf.hf_shapes(cfg)
  back = hf.hf_state_dict_to_flat(weights, cfg)
  for key in flat:
    np.testing.assert_array_equal(back[key], flat[key], err_msg=key)
  assert not any(p.name.startswith('.hf') for p in exported.parent.iterdir())  # no temp dirs left behind


LOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification,
                              AutoTokenizer)
    path, ids_file, out_file = sys.argv[1:4]
    inputs = np.load(ids_file)
    ids = torch.from_numpy(inputs["ids"]).long()
    mask = torch.from_numpy(inputs["mask"]).long()
    kw = dict(trust_remote_code=True, local_files_only=True)
    config = AutoConfig.from_pretrained(path, **kw)
    mlm = AutoModelForMaskedLM.from_pretrained(path, **kw).eval()
    base = AutoModel.from_pretrained(path, **kw).eval()
    clf = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3, **kw).eval()
    tok = AutoTokenizer.from_pretrained(path, **kw)
    with torch.no_grad():
        logits = mlm(input_ids=ids, attention_mask=mask).logits.numpy()
        hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        clf_logits = clf(input_ids=ids, attention_mask=mask).logits.numpy()
    enc = tok(["Hello world!", "NeoBERT in JAX"], padding=True)
    out = tok("Hello world!", return_tensors="pt")
    with torch.no_grad():
        from_tokenizer = mlm(**out).logits  # token_type_ids from a BERT tokenizer are accepted
    np.savez(out_file, logits=logits, hidden=hidden, clf_logits=clf_logits)
    print(json.dumps({"config": type(config).__name__, "mlm": type(mlm).__name__, "base": type(base).__name__,
                      "clf": type(clf).__name__, "tokenizer": type(tok).__name__,
                      "input_ids": enc["input_ids"], "mask_token_id": tok.mask_token_id,
                      "model_max_length": tok.model_max_length, "tok_logits": list(from_tokenizer.shape),
                      "decoder_equal": bool(torch.equal(mlm.model.encoder.weight, base.encoder.weight))}))
""")


@pytest.mark.slow
def test_transformers_loads_export_in_fresh_offline_process(exported, source, tmp_path):
  cfg, flat = source
  rng = np.random.default_rng(1)
  ids = rng.integers(1000, 30000, size=(2, 11)).astype(np.int32)
  lengths = np.array([11, 6], np.int32)
  mask = np.arange(11)[None] < lengths[:, None]
  ids = np.where(mask, ids, 0).astype(np.int32)
  np.savez(tmp_path / 'inputs.npz', ids=ids, mask=mask.astype(np.int64))
  script = tmp_path / 'load.py'
  script.write_text(LOAD_SCRIPT)
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH',)}
  env.update(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', HF_HOME=str(tmp_path / 'hf_home'))
  # cwd outside the repo and no PYTHONPATH: the exported model.py must stand alone (torch + transformers only).
  run = subprocess.run(
    [sys.executable, str(script), str(exported), str(tmp_path / 'inputs.npz'), str(tmp_path / 'out.npz')],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  info = json.loads(run.stdout.strip().splitlines()[-1])
  assert (info['config'], info['mlm'], info['base'], info['clf']) == (
    'NeoBERTConfig',
    'NeoBERTLMHead',
    'NeoBERTModel',
    'NeoBERTForSequenceClassification',
  )
  assert info['tokenizer'] == 'BertTokenizerFast'
  first = info['input_ids'][0]
  assert first[:5] == [101, 7592, 2088, 999, 102] and set(first[5:]) <= {0}  # [CLS] hello world ! [SEP] + padding
  assert len(first) < 128  # the packaged tokenizer.json pads to 128; the export switched that off
  assert info['mask_token_id'] == 103 and info['model_max_length'] == 512
  assert info['tok_logits'] == [1, 5, 30522]
  assert info['decoder_equal']
  out = np.load(tmp_path / 'out.npz')
  jax_model = model_from_flat(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)), flat)
  want = np.asarray(jax_model(ids, lengths=lengths))
  np.testing.assert_allclose(out['logits'][mask], want[mask], atol=1e-4, rtol=0)
  hidden = np.asarray(jax_model.encoder(ids, lengths=lengths))
  np.testing.assert_allclose(out['hidden'][mask], hidden[mask], atol=1e-4, rtol=0)
  assert out['clf_logits'].shape == (2, 3)


def test_import_round_trip_and_jax_model(exported, source, tmp_path):
  cfg, flat = source
  cfg2, flat2 = hf.read_hf_dir(exported)
  for field in (
    'vocab_size',
    'hidden_size',
    'num_layers',
    'num_heads',
    'intermediate_size',
    'norm_eps',
    'max_length',
    'rope_theta',
  ):
    assert cfg2[field] == cfg[field], field
  for key in flat:
    np.testing.assert_array_equal(flat2[key], flat[key], err_msg=key)
  model = model_from_flat(lambda: NeoBERTForMLM(cfg2, rngs=nnx.Rngs(0)), flat2)
  np.testing.assert_array_equal(to_flat(model)['encoder.layers.qkv'], flat['encoder.layers.qkv'])
  # A .safetensors file with config.json beside it works too.
  _, flat3 = hf.read_hf_dir(exported / 'model.safetensors')
  np.testing.assert_array_equal(flat3['encoder.layers.w12'], flat['encoder.layers.w12'])
  # Saved flat params (file and directory) load back with their config.
  for out in (tmp_path / 'params.safetensors', tmp_path / 'params_dir'):
    convert_job.save_flat(flat2, cfg2, out)
    cfg4, flat4 = load_saved_flat(out)
    assert cfg4.to_dict() == cfg2.to_dict()
    np.testing.assert_array_equal(flat4['decoder.kernel'], flat['decoder.kernel'])


def test_export_bfloat16(source, tmp_path):
  cfg, flat = source
  out = export_hf.export_flat(flat, cfg, tmp_path / 'bf16', dtype='bfloat16')
  assert json.loads((out / 'config.json').read_text())['torch_dtype'] == 'bfloat16'
  weights = load_file(str(out / 'model.safetensors'))
  assert str(weights['decoder.weight'].dtype) == 'bfloat16'
  np.testing.assert_allclose(weights['decoder.weight'].astype(np.float32), flat['decoder.kernel'].T, rtol=1e-2)


def write_vocab(path, size):
  specials = ['[PAD]'] + [f'[unused{i}]' for i in range(99)] + ['[UNK]', '[CLS]', '[SEP]', '[MASK]']
  path.write_text('\n'.join(specials + [f'tok{i}' for i in range(size - len(specials))]) + '\n')
  return path


def test_tokenizer_larger_than_vocab_is_refused(source, tmp_path):
  cfg, flat = source
  with pytest.raises(errors.ExportError, match="30600 tokens but the model's vocab_size is 30522"):
    export_hf.export_flat(flat, cfg, tmp_path / 'hf', tokenizer=write_vocab(tmp_path / 'vocab.txt', 30600))
  sentencepiece = tmp_path / 'sp.model'
  sentencepiece.write_bytes(b'')
  with pytest.raises(errors.ExportError, match='only WordPiece'):
    export_hf.export_flat(flat, cfg, tmp_path / 'hf', tokenizer=sentencepiece)
  with pytest.raises(errors.ExportError, match='no such file'):
    export_hf.export_flat(flat, cfg, tmp_path / 'hf', tokenizer=tmp_path / 'missing.json')
  assert sorted(p.name for p in tmp_path.iterdir()) == ['sp.model', 'vocab.txt']  # no partial output


def test_existing_output_is_kept_unless_overwrite(source, tmp_path):
  cfg, flat = source
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'keep.txt').write_text('precious')
  with pytest.raises(errors.ExportError, match='--overwrite'):
    export_hf.export_flat(flat, cfg, out)
  assert (out / 'keep.txt').read_text() == 'precious'
  # A failing export (bad params) leaves neither a partial directory nor temp files.
  bad = dict(flat)
  del bad['decoder.bias']
  with pytest.raises(errors.ExportError, match='decoder.bias'):
    export_hf.export_flat(bad, cfg, tmp_path / 'new')
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out']
  export_hf.export_flat(flat, cfg, out, overwrite=True)
  assert not (out / 'keep.txt').exists() and (out / 'model.safetensors').is_file()
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out']


def test_export_from_sharded_training_checkpoint(tmp_path):
  """A checkpoint written by the trainer on an 8-device FSDP mesh exports on one CPU, weights unchanged."""
  from configs import tiny_cpu
  from neobert_jax import sharding
  from neobert_jax.engine import checkpoint
  from neobert_jax.train.mlm import create_train_state

  cfg = tiny_cpu.get_config()
  vocab = write_vocab(tmp_path / 'vocab.txt', 1000)
  cfg.data.tokenizer = str(vocab)  # the training config's tokenizer is exported when none is given
  mesh = sharding.make_mesh({'data': 1, 'fsdp': -1, 'tensor': 1})
  defs, state = create_train_state(cfg, mesh)
  workdir = tmp_path / 'run'
  mngr = checkpoint.make_manager(workdir, async_save=False)
  checkpoint.save(mngr, 7, state, None, cfg)
  mngr.wait_until_finished()
  mngr.close()
  expected = to_flat(nnx.merge(defs.model_def, state['params']))  # gathered from the 8 devices
  out = export_hf.export_checkpoint(workdir, tmp_path / 'hf')
  weights = load_file(str(out / 'model.safetensors'))
  back = hf.hf_state_dict_to_flat(weights, cfg.model)
  assert back.keys() == expected.keys()
  for key in expected:
    np.testing.assert_array_equal(back[key], expected[key], err_msg=key)
  assert json.loads((out / 'config.json').read_text())['hidden_size'] == cfg.model.hidden_size
  assert (out / 'vocab.txt').read_bytes() == vocab.read_bytes()
  assert json.loads((out / 'tokenizer_config.json').read_text())['model_max_length'] == cfg.model.max_length
  # Through the CLI, with an explicit step; a step that does not exist is a clear error.
  convert_job.to_pytorch(str(workdir / 'checkpoints'), str(tmp_path / 'hf2'), step=7)
  assert load_file(str(tmp_path / 'hf2' / 'model.safetensors')).keys() == weights.keys()
  assert reported('convert', convert_job.to_pytorch, str(workdir), str(tmp_path / 'x'), step=8)[0] == 1


# ---------------------------------------------------------------------------------------------------------------
# CLI


def run_job(capsys, job, source, output, **options):
  """(exit status, what the command would print: the job's line or the error's)."""
  code, said = reported('convert', job, str(source), str(output), **options)
  return code, (said or '') + capsys.readouterr().err


def test_cli_round_trip(exported, tmp_path, capsys):
  code, out = run_job(capsys, convert_job.from_pytorch, exported, tmp_path / 'p.safetensors')
  assert code == 0, out
  assert '2 layers x 64' in out
  code, out = run_job(capsys, convert_job.to_pytorch, tmp_path / 'p.safetensors', tmp_path / 'hf')
  assert code == 0, out
  original = load_file(str(exported / 'model.safetensors'))
  again = load_file(str(tmp_path / 'hf' / 'model.safetensors'))
  assert original.keys() == again.keys()
  for key in original:
    np.testing.assert_array_equal(again[key], original[key], err_msg=key)


def broken_copy(exported, tmp_path, edit_weights=None, edit_config=None):
  out = tmp_path / 'broken'
  out.mkdir()
  weights = load_file(str(exported / 'model.safetensors'))
  config = json.loads((exported / 'config.json').read_text())
  if edit_weights:
    edit_weights(weights)
  if edit_config:
    edit_config(config)
  save_file(weights, str(out / 'model.safetensors'), metadata={'format': 'pt'})
  (out / 'config.json').write_text(json.dumps(config))
  return out


def test_cli_missing_key(exported, tmp_path, capsys):
  src = broken_copy(exported, tmp_path, edit_weights=lambda w: w.pop('model.transformer_encoder.1.ffn.w3.weight'))
  code, out = run_job(capsys, convert_job.from_pytorch, src, tmp_path / 'p.safetensors')
  assert code == 1
  assert 'missing keys (1): model.transformer_encoder.1.ffn.w3.weight' in out and 'Fix:' in out
  assert not (tmp_path / 'p.safetensors').exists()


def test_cli_wrong_shape(exported, tmp_path, capsys):
  def shrink(w):
    w['decoder.bias'] = w['decoder.bias'][:100]

  src = broken_copy(exported, tmp_path, edit_weights=shrink)
  code, out = run_job(capsys, convert_job.from_pytorch, src, tmp_path / 'p.safetensors')
  assert code == 1
  assert 'decoder.bias: expected shape (30522,), got (100,)' in out


def test_cli_config_mismatch(exported, tmp_path, capsys):
  src = broken_copy(exported, tmp_path, edit_config=lambda c: c.update(num_hidden_layers=3))
  code, out = run_job(capsys, convert_job.from_pytorch, src, tmp_path / 'p.safetensors')
  assert code == 1
  assert 'missing keys' in out and 'model.transformer_encoder.2.qkv.weight' in out
  assert 'num_hidden_layers' in out  # the fix names the config field


def test_cli_not_neobert_and_missing_input(exported, tmp_path, capsys):
  src = broken_copy(exported, tmp_path, edit_config=lambda c: c.update(model_type='bert'))
  code, out = run_job(capsys, convert_job.from_pytorch, src, tmp_path / 'p.safetensors')
  assert code == 1 and "model_type='bert'" in out
  code, out = run_job(capsys, convert_job.from_pytorch, tmp_path / 'nope', tmp_path / 'p.safetensors')
  assert code == 1 and 'no such file' in out
  code, out = run_job(capsys, convert_job.to_pytorch, tmp_path / 'nope', tmp_path / 'hf')
  assert code == 1 and 'no such directory' in out


def test_cli_base_model_without_decoder(exported, tmp_path, capsys):
  def strip(w):
    for key in list(w):
      if key.startswith('decoder.'):
        del w[key]
      else:
        w[key[len('model.') :]] = w.pop(key)

  src = broken_copy(exported, tmp_path, edit_weights=strip)
  code, out = run_job(capsys, convert_job.from_pytorch, src, tmp_path / 'p.safetensors')
  assert code == 1 and '--init-missing-decoder' in out
  code, out = run_job(capsys, convert_job.from_pytorch, src, tmp_path / 'p.safetensors', init_missing_decoder=True)
  assert code == 0, out
  _, flat = load_saved_flat(tmp_path / 'p.safetensors')
  assert np.all(flat['decoder.bias'] == 0) and np.abs(flat['decoder.kernel']).max() <= 0.02


def test_cli_refuses_existing_output(exported, tmp_path, capsys):
  target = tmp_path / 'p.safetensors'
  target.write_bytes(b'old')
  code, out = run_job(capsys, convert_job.from_pytorch, exported, target)
  assert code == 1 and '--overwrite' in out and target.read_bytes() == b'old'
  code, out = run_job(capsys, convert_job.to_pytorch, target, exported)
  assert code == 1 and '--overwrite' in out


def test_cli_runs_as_module(tmp_path):
  run = subprocess.run(
    [
      sys.executable,
      '-m',
      'neobert_jax.convert',
      'from-pytorch',
      '--input',
      tmp_path / 'nope',
      '--output',
      tmp_path / 'x.safetensors',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 1
  assert 'error:' in run.stderr and 'no such file' in run.stderr
