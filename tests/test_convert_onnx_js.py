"""`convert to-onnx`'s directories as written, in transformers.js on node, against the PyTorch export.

The test installs @huggingface/transformers (TRANSFORMERS_JS) from the npm registry into the project cache (once)
and runs one script under node: the feature-extraction pipeline on the ``--task hidden`` directory with cls and mean
pooling, the fill-mask pipeline on the ``--task mlm`` one, the feature-extraction pipeline on the embedding graph of a
sentence-transformers directory as written (pooled and normalised as its modules say; one embedding from three paths:
transformers.js, sentence-transformers on the PyTorch directory and onnxruntime's sentence_embedding, within
EMBEDDING_TOLERANCE), all with transformers.js defaults (onnx/model.onnx on
node's CPU backend); the feature-extraction pipeline with ``dtype: 'q8'`` (onnx/model_quantized.onnx, the file a
browser's default, wasm, loads); and that file run by onnxruntime-web's WASM backend, what a browser runs
(transformers.js's node build offers no 'wasm' device, so the script calls onnxruntime-web itself). Skipped only when
node or the npm registry is missing.
"""

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard

from neobert_jax.convert import export_hf
from neobert_jax.convert.hf_modeling import model as hf_model
from neobert_jax.weights import hf
from neobert_jax.data import assets
from neobert_jax.finetune import export as finetune_export
import test_convert_export
import test_convert_onnx
from neobert_jax.jobs import convert as convert_job
from test_convert_export import run_job
from test_convert_onnx import ort

TRANSFORMERS_JS = '@huggingface/transformers@4.3.1'
bert_tokenizer = test_convert_export.bert_tokenizer  # the module fixture
TEXTS = ['hello world', 'a longer sentence about the football league']
MASKED = 'the football [MASK] won the league.'
# Absolute, on unit vectors: the three paths' float32 kernels and summation orders (measured 1.2e-7).
EMBEDDING_TOLERANCE = 1e-5

SCRIPT = textwrap.dedent(
  """
  import fs from 'node:fs';
  import { pipeline, AutoTokenizer, env } from '@huggingface/transformers';
  import * as ortWeb from 'onnxruntime-web';
  const [root, outFile] = process.argv.slice(2);
  env.allowRemoteModels = false;
  env.localModelPath = root;
  const texts = JSON.parse(process.env.TEXTS);
  const out = {};
  const features = await pipeline('feature-extraction', 'hidden');  // the defaults: onnx/model.onnx
  out.cls = (await features(texts, { pooling: 'cls' })).tolist();
  out.mean = (await features(texts, { pooling: 'mean', normalize: true })).tolist();
  const fill = await pipeline('fill-mask', 'mlm');
  out.fill = await fill(process.env.MASKED, { top_k: 5 });
  // The embedding graph of a sentence-transformers directory, pooled and normalised as its modules say.
  const pooling = JSON.parse(fs.readFileSync(`${root}/embedding/1_Pooling/config.json`, 'utf8'));
  const modules = JSON.parse(fs.readFileSync(`${root}/embedding/modules.json`, 'utf8'));
  out.st_options = {
    pooling: pooling.pooling_mode_cls_token ? 'cls' : 'mean',
    normalize: modules.some((m) => m.type.endsWith('.Normalize')),
  };
  const embed = await pipeline('feature-extraction', 'embedding');
  out.embedding = (await embed(texts, out.st_options)).tolist();
  const q8 = await pipeline('feature-extraction', 'hidden', { dtype: 'q8' });  // onnx/model_quantized.onnx
  out.q8_mean = (await q8(texts, { pooling: 'mean', normalize: true })).tolist();
  const tok = await AutoTokenizer.from_pretrained('hidden');
  const enc = tok(texts, { padding: true });
  out.ids = enc.input_ids.tolist().map((row) => row.map(Number));
  ortWeb.env.wasm.numThreads = 1;
  const wasm = await ortWeb.InferenceSession.create(
    fs.readFileSync(`${root}/hidden/onnx/model_quantized.onnx`), { executionProviders: ['wasm'] });
  const result = await wasm.run({
    input_ids: new ortWeb.Tensor('int64', enc.input_ids.data, enc.input_ids.dims),
    attention_mask: new ortWeb.Tensor('int64', enc.attention_mask.data, enc.attention_mask.dims),
  });
  out.wasm_hidden = { dims: result.last_hidden_state.dims, data: Array.from(result.last_hidden_state.data) };
  fs.writeFileSync(outFile, JSON.stringify(out));
  """
)


def node_modules() -> Path:
  """node_modules holding TRANSFORMERS_JS (and its onnxruntime-node and onnxruntime-web), installed once."""
  if shutil.which('node') is None or shutil.which('npm') is None:
    pytest.skip('node / npm not installed')
  root = Path(assets.asset_cache_dir()) / 'node' / TRANSFORMERS_JS.replace('/', '+')
  done = root / 'installed'
  with assets.locked('node-modules'):
    if not done.is_file():
      root.mkdir(parents=True, exist_ok=True)
      # onnxruntime-node's install script would fetch CUDA libraries from nuget.org: the CPU build is in the package.
      env = {**os.environ, 'ONNXRUNTIME_NODE_INSTALL': 'skip', 'ONNXRUNTIME_NODE_INSTALL_CUDA': 'skip'}
      run = subprocess.run(
        ['npm', 'install', '--no-audit', '--no-fund', '--prefix', str(root), TRANSFORMERS_JS],
        capture_output=True, text=True, timeout=600, env=env,
      )  # fmt: skip
      if run.returncode != 0 or not (root / 'node_modules' / 'onnxruntime-web').is_dir():
        pytest.skip(f'could not install {TRANSFORMERS_JS} from the npm registry: {run.stderr[-500:]}')
      done.write_text(TRANSFORMERS_JS + '\n')
  return root / 'node_modules'


@pytest.mark.slow
def test_transformers_js_runs_the_onnx_directories_as_written(bert_tokenizer, tmp_path, capsys):
  modules = node_modules()
  cfg = test_convert_onnx.small_config()
  rng = np.random.default_rng(0)
  state = {k: rng.normal(0, 0.2, shape).astype(np.float32) for k, shape in hf.hf_shapes(cfg).items()}
  src = export_hf.export_flat(hf.hf_state_dict_to_flat(state, cfg), cfg, tmp_path / 'hf', tokenizer=bert_tokenizer)
  for task in ('hidden', 'mlm'):
    code, out = run_job(capsys, convert_job.to_onnx, src, tmp_path / 'onnx' / task, task=task)
    assert code == 0, out
  flat = hf.hf_state_dict_to_flat(state, cfg)
  st_dir = finetune_export.export_sentence_transformer(flat, cfg, tmp_path / 'st', tokenizer=bert_tokenizer)
  code, out = run_job(capsys, convert_job.to_onnx, st_dir, tmp_path / 'onnx' / 'embedding')  # its default
  assert code == 0 and '(embedding)' in out, out
  (tmp_path / 'node_modules').symlink_to(modules)
  (tmp_path / 'run.mjs').write_text(SCRIPT)
  env = {**os.environ, 'TEXTS': json.dumps(TEXTS), 'MASKED': MASKED}
  run = subprocess.run(
    ['node', 'run.mjs', f'{tmp_path / "onnx"}/', str(tmp_path / 'out.json')],
    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert run.returncode == 0, run.stderr[-3000:]
  js = json.loads((tmp_path / 'out.json').read_text())

  from transformers import AutoTokenizer

  tok = AutoTokenizer.from_pretrained(src)
  enc = tok(TEXTS, padding=True, return_tensors='pt')
  assert js['ids'] == enc['input_ids'].tolist()  # the same tokenizer files, read by both
  model = hf_model.NeoBERTLMHead.from_pretrained(src).eval()
  real = enc['attention_mask'].unsqueeze(-1).float()
  with torch.no_grad():
    hidden = model.model(**enc).last_hidden_state
    mean = torch.nn.functional.normalize((hidden * real).sum(1) / real.sum(1), dim=-1).numpy()
    masked = tok(MASKED, return_tensors='pt')
    where = masked['input_ids'][0].tolist().index(tok.mask_token_id)
    top5 = model(**masked).logits[0, where].softmax(-1).topk(5)
  test_convert_onnx.close(np.asarray(js['cls']), hidden[:, 0].numpy())
  test_convert_onnx.close(np.asarray(js['mean']), mean)
  assert [r['token'] for r in js['fill']] == top5.indices.tolist()
  # One embedding, three paths: transformers.js on the embedding graph as written (pooling and normalisation from
  # the sentence-transformers config), sentence-transformers on the PyTorch directory, onnxruntime's
  # sentence_embedding output of the same graph. Unit vectors: within EMBEDDING_TOLERANCE of each other.
  assert js['st_options'] == {'pooling': 'mean', 'normalize': True}
  from sentence_transformers import SentenceTransformer

  st = SentenceTransformer(str(st_dir), trust_remote_code=True, device='cpu').encode(TEXTS, convert_to_numpy=True)
  session = ort.InferenceSession(str(tmp_path / 'onnx' / 'embedding' / 'onnx' / 'model.onnx'))
  feeds = {k: enc[k].numpy() for k in ('input_ids', 'attention_mask')}
  _, sentence = session.run(None, feeds)
  embedding = np.asarray(js['embedding'])
  np.testing.assert_allclose(embedding, st, atol=EMBEDDING_TOLERANCE)
  np.testing.assert_allclose(sentence, st, atol=EMBEDDING_TOLERANCE)
  np.testing.assert_allclose(np.linalg.norm(st, axis=-1), 1.0, atol=1e-5)
  card = ModelCard.load(tmp_path / 'onnx' / 'embedding' / 'README.md')  # the ONNX directory's own card
  assert (card.data.library_name, card.data.pipeline_tag) == ('transformers.js', 'feature-extraction')
  assert 'onnx' in card.data.tags and "backend='onnx'" in card.text
  np.testing.assert_allclose([r['score'] for r in js['fill']], top5.values.numpy(), rtol=1e-3)
  # int8 weights: the pooled vectors stay close to float32's (cosine), and the WASM backend computes what
  # onnxruntime-node computes on the same int8 graph.
  q8 = np.asarray(js['q8_mean'])
  assert (q8 * mean).sum(-1).min() > 0.99
  wasm = np.asarray(js['wasm_hidden']['data'], np.float32).reshape(js['wasm_hidden']['dims'])
  wasm_mean = (wasm * real.numpy()).sum(1) / real.numpy().sum(1)
  wasm_mean /= np.linalg.norm(wasm_mean, axis=-1, keepdims=True)
  np.testing.assert_allclose(wasm_mean, q8, atol=1e-4)
