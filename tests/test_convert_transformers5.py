"""The exports under the newest transformers (5.x) and sentence-transformers (6.x), next to the pinned 4.57.

The test installs transformers==5.24.0 and sentence-transformers==6.2.0 from the package index into their own
environment (a venv without pip that sees this environment's packages, torch included, after its own: cached under
the project cache, so only the first run installs). It writes a tiny MLM export and a tiny sentence-transformers
export, then runs one script in a fresh process under each transformers: AutoTokenizer without trust_remote_code
(the tokenizer needs no remote code, so 5.x must not ask), AutoModelForMaskedLM with padding and with
attention_mask=None, gradient checkpointing, AutoModel on the sentence-transformers directory and
SentenceTransformer.encode. Both processes must agree within float32 rounding (same torch, same model.py; 1e-5 of
the output's scale).
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import numpy as np
import pytest

from neobert_jax.convert import export_hf
from neobert_jax.data import assets
from neobert_jax.finetune import export as finetune_export
from neobert_jax.model import default_model_config
from neobert_jax.weights import hf
import test_convert_export

# parameterized: transformers' own common tests need it (tests/test_convert_transformers_suite.py, one environment).
NEWEST = ('transformers==5.24.0', 'sentence-transformers==6.2.0', 'parameterized==0.9.0')
bert_tokenizer = test_convert_export.bert_tokenizer  # the module fixture

SCRIPT = textwrap.dedent(
  """
  import json, sys
  import torch, transformers
  from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer
  from sentence_transformers import SentenceTransformer
  hf_dir, st_dir, out_file = sys.argv[1:4]
  texts = ['hello world', 'a longer sentence about the football league']
  tok = AutoTokenizer.from_pretrained(hf_dir)  # no trust_remote_code: must not need it
  enc = tok(texts, padding=True, return_tensors='pt')
  mlm = AutoModelForMaskedLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
  out = {'transformers': transformers.__version__, 'ids': enc['input_ids'].tolist()}
  with torch.no_grad():
    out['logits'] = mlm(**enc).logits[enc['attention_mask'].bool()].tolist()
    out['no_mask'] = mlm(input_ids=enc['input_ids'][1:]).logits[0].tolist()
  mlm.train()
  mlm.gradient_checkpointing_enable()
  loss = mlm(**enc, labels=enc['input_ids']).loss
  loss.backward()
  out['loss'] = loss.item()
  out['grad_finite'] = all(bool(torch.isfinite(p.grad).all()) for p in mlm.parameters() if p.grad is not None)
  base = AutoModel.from_pretrained(st_dir, trust_remote_code=True).eval()
  with torch.no_grad():
    out['hidden'] = base(**enc).last_hidden_state[enc['attention_mask'].bool()].tolist()
  st = SentenceTransformer(st_dir, trust_remote_code=True, device='cpu')
  out['st'] = st.encode(texts, convert_to_numpy=True).tolist()
  with open(out_file, 'w') as f:
    json.dump(out, f)
  """
)


def layered_env(packages: tuple[str, ...]) -> Path:
  """The python of a venv holding ``packages`` (and what they need that this environment lacks), with this
  environment's site-packages after its own; skips the test when the package index cannot be reached."""
  base = [p for p in sys.path if p.endswith('site-packages') and Path(p).is_dir()]
  # Keyed by the environment it extends too: a cached one made beside another venv would see that venv's packages
  # (or, once it is deleted, no torch at all).
  key = hashlib.sha256('\n'.join(base).encode()).hexdigest()[:10]
  root = Path(assets.asset_cache_dir()) / 'transformers5' / f'{"-".join(packages)}-{key}'
  python = root / 'bin' / 'python'
  done = root / 'installed'
  with assets.locked('layered-env'):  # two test processes must not build one environment at once
    if done.is_file():
      return python
    venv.EnvBuilder(with_pip=False, clear=True).create(root)
    site = next((root / 'lib').glob('python*/site-packages'))
    (site / 'base_env.pth').write_text('\n'.join(base) + '\n')
    run = subprocess.run(
      [str(python), '-m', 'pip', 'install', '-q', *packages], capture_output=True, text=True, timeout=600
    )
    if run.returncode != 0:
      pytest.skip(f'could not install {" ".join(packages)} from the package index: {run.stderr[-500:]}')
    done.write_text('\n'.join(packages) + '\n')
  return python


def newest_env() -> Path:
  """The newest transformers and sentence-transformers (with parameterized, for transformers' own tests)."""
  return layered_env(NEWEST)


def tiny_exports(root: Path, tokenizer) -> tuple[Path, Path]:
  cfg = default_model_config()
  cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size, cfg.max_length = 32, 2, 2, 64, 64
  rng = np.random.default_rng(0)
  state = {k: rng.normal(0, 0.2, shape).astype(np.float32) for k, shape in hf.hf_shapes(cfg).items()}
  flat = hf.hf_state_dict_to_flat(state, cfg)
  hf_dir = export_hf.export_flat(flat, cfg, root / 'hf', tokenizer=tokenizer)
  st_dir = finetune_export.export_sentence_transformer(flat, cfg, root / 'st', tokenizer=tokenizer)
  return hf_dir, st_dir


def run_script(python, hf_dir, st_dir, tmp_path, name) -> dict:
  script = tmp_path / 'load.py'
  script.write_text(SCRIPT)
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  env.update(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', HF_HOME=str(tmp_path / 'hf_home'))
  out = tmp_path / f'{name}.json'
  run = subprocess.run(
    [str(python), str(script), str(hf_dir), str(st_dir), str(out)],
    cwd=tmp_path,
    env=env,
    stdin=subprocess.DEVNULL,  # a remote-code prompt would fail, not wait
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(out.read_text())


@pytest.mark.slow
def test_exports_load_and_agree_under_the_newest_transformers(bert_tokenizer, tmp_path):
  hf_dir, st_dir = tiny_exports(tmp_path, bert_tokenizer)
  pinned = run_script(sys.executable, hf_dir, st_dir, tmp_path, 'pinned')
  newest = run_script(newest_env(), hf_dir, st_dir, tmp_path, 'newest')
  assert pinned['transformers'].startswith('4.') and newest['transformers'] == NEWEST[0].split('==')[1]
  assert pinned['ids'] == newest['ids'] and pinned['ids'][0][:2] == [101, 7592]
  for key in ('logits', 'no_mask', 'hidden', 'st'):
    want, got = np.asarray(pinned[key]), np.asarray(newest[key])
    assert got.shape == want.shape and np.isfinite(got).all(), key
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), key
  # The sentence-transformers pipeline (mean pooling, normalised) on top of the base model.
  np.testing.assert_allclose(np.linalg.norm(newest['st'], axis=-1), 1.0, atol=1e-5)
  assert newest['grad_finite'] and pinned['grad_finite']
  assert abs(newest['loss'] - pinned['loss']) <= 1e-5 * abs(pinned['loss'])
