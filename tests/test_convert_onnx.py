"""`convert to-onnx`: the MLM and the embedding model as ONNX graphs with dynamic batch and length axes, run by
onnxruntime against PyTorch (other shapes than the traced ones, padded and fully padded rows), the
sentence-transformers directory's encode against our JAX `embed`, and the one-line errors.

Tolerance: onnxruntime and PyTorch compute the same float32 math with other kernels and summation orders; at these
sizes that is ~1e-6 relative, and the bound is 1e-4 of the output's largest magnitude (a wrong mask or position
gives O(1) differences).
"""

import json

import numpy as np
import pytest
import torch

from neobert_jax import errors
from neobert_jax.convert import export_hf
from neobert_jax.convert.hf_modeling import model as hf_model
from neobert_jax.model import default_model_config
from neobert_jax.weights import hf
import test_convert_export
from neobert_jax.jobs import convert as convert_job
from test_convert_export import run_job

ort = pytest.importorskip('onnxruntime')
bert_tokenizer = test_convert_export.bert_tokenizer  # the module fixture
# int8 weights against float32, on these random small models: the largest logit error relative to the largest
# logit (measured 0.0xx, see docs/export.md for a trained model).
QUANTIZED_LOGIT_ERROR = 0.1


def small_config():
  cfg = default_model_config()
  cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size, cfg.max_length = 32, 2, 2, 64, 64
  return cfg


@pytest.fixture(scope='module')
def flat():
  cfg = small_config()
  rng = np.random.default_rng(0)
  state = {k: rng.normal(0, 0.2, shape).astype(np.float32) for k, shape in hf.hf_shapes(cfg).items()}
  return cfg, hf.hf_state_dict_to_flat(state, cfg)


def batch(lengths, width, seed=0):
  rng = np.random.default_rng(seed)
  mask = (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype(np.int64)
  return rng.integers(1000, 30000, (len(lengths), width)).astype(np.int64) * mask, mask


def close(got, want, mask=None):
  if mask is not None:
    got, want = got[mask.astype(bool)], want[mask.astype(bool)]
  assert np.isfinite(got).all()
  assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def op_types(onnx_dir, name='onnx/model.onnx') -> set[str]:
  """The graph's op types, its subgraphs' (the per-document Loop's body) included."""
  import onnx

  def walk(graph):
    for node in graph.node:
      yield node.op_type
      for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
          yield from walk(attr.g)

  return set(walk(onnx.load(str(onnx_dir / name)).graph))


@pytest.mark.slow
def test_mlm_graph_matches_pytorch_at_other_shapes(flat, tmp_path, capsys):
  """The float32 graph equals PyTorch on every position (zeros at padding); the int8 one is a valid graph whose
  logits stay near them (QUANTIZED_LOGIT_ERROR) and rank the same top token on most positions."""
  import onnx

  cfg, params = flat
  src = export_hf.export_flat(params, cfg, tmp_path / 'hf')
  code, out = run_job(capsys, convert_job.to_onnx, src, tmp_path / 'onnx')  # opset 23
  assert code == 0, out
  assert 'onnx/model.onnx' in out and 'onnx/model_quantized.onnx' in out and '(mlm)' in out
  assert "pipeline('fill-mask'" in out and 'InferenceSession' in out  # how to load it
  written = tmp_path / 'onnx'
  assert json.loads((written / 'config.json').read_text())['onnx_outputs'] == ['logits']
  assert 'Attention' in op_types(written)  # ONNX's fused attention, which onnxruntime runs as one kernel
  assert 'NonZero' in op_types(written)  # the dense layers run on the real tokens, gathered (TracedRows)
  assert 'Loop' in op_types(written)  # attention per document (onnx_rewrite)
  assert 'RotaryEmbedding' in op_types(written)  # q and k rotated in one kernel (onnx_rewrite)
  quantized = op_types(written, 'onnx/model_quantized.onnx')
  assert 'Attention' in quantized and 'QAttention' not in quantized and 'MatMulInteger' in quantized
  onnx.checker.check_model(str(written / 'onnx/model_quantized.onnx'))
  session = ort.InferenceSession(str(written / 'onnx/model.onnx'), providers=['CPUExecutionProvider'])
  int8 = ort.InferenceSession(str(written / 'onnx/model_quantized.onnx'), providers=['CPUExecutionProvider'])
  model = hf_model.NeoBERTLMHead.from_pretrained(src).eval()
  for lengths, width, left in (
    ([13, 5, 0, 9], 13, False),
    ([3], 3, False),
    ([20, 20], 20, False),
    ([4, 11], 11, True),
    ([0, 0], 4, False),
  ):
    ids, mask = batch(lengths, width)
    if left:  # padding before the tokens: each row's tokens still lie together once gathered
      ids, mask = ids[:, ::-1].copy(), mask[:, ::-1].copy()
    (got,) = session.run(None, {'input_ids': ids, 'attention_mask': mask})
    (got8,) = int8.run(None, {'input_ids': ids, 'attention_mask': mask})
    with torch.no_grad():
      want = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()  # unpadded
    assert got.shape == (len(lengths), width, cfg.vocab_size)
    close(got, want)  # the whole tensor: padded positions are zeros in both
    real = mask.astype(bool)
    if real.any():
      error = np.abs(got8 - want)[real].max() / np.abs(want[real]).max()
      agree = (got8.argmax(-1) == want.argmax(-1))[real].mean()
      assert error < QUANTIZED_LOGIT_ERROR and agree >= 0.8, (error, agree)


@pytest.mark.slow
def test_mlm_graph_of_a_biased_tied_model_matches_pytorch(tmp_path, capsys):
  """model.use_bias and model.tie_word_embeddings reach the graph: the block biases are in it, and the decoder
  reads the embedding (a graph that dropped either would be O(1) off on these random weights)."""
  cfg = small_config()
  cfg.use_bias = cfg.tie_word_embeddings = True
  rng = np.random.default_rng(1)
  state = {k: rng.normal(0, 0.2, shape).astype(np.float32) for k, shape in hf.hf_shapes(cfg).items()}
  assert 'decoder.weight' not in state and 'model.transformer_encoder.0.qkv.bias' in state
  src = export_hf.export_flat(hf.hf_state_dict_to_flat(state, cfg), cfg, tmp_path / 'hf')
  code, out = run_job(capsys, convert_job.to_onnx, src, tmp_path / 'onnx')
  assert code == 0, out
  session = ort.InferenceSession(str(tmp_path / 'onnx' / 'onnx/model.onnx'), providers=['CPUExecutionProvider'])
  model = hf_model.NeoBERTLMHead.from_pretrained(src).eval()
  assert model.decoder.weight.data_ptr() == model.model.encoder.weight.data_ptr()  # tied in PyTorch too
  ids, mask = batch([11, 4], 11, seed=2)
  (got,) = session.run(None, {'input_ids': ids, 'attention_mask': mask})
  with torch.no_grad():
    want = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
  close(got, want)


@pytest.mark.slow
def test_sentence_transformers_export_encode_embed_and_onnx_agree(flat, bert_tokenizer, tmp_path, capsys):
  from sentence_transformers import SentenceTransformer

  from neobert_jax import embed
  from neobert_jax.finetune import export as finetune_export

  cfg, params = flat
  st_dir = finetune_export.export_sentence_transformer(params, cfg, tmp_path / 'st', tokenizer=bert_tokenizer)
  texts = ['Markets rally as rates fall', 'A longer sentence about the football club that won the league.', 'x']
  st = SentenceTransformer(str(st_dir), trust_remote_code=True, device='cpu')
  st_emb = st.encode(texts, convert_to_numpy=True, batch_size=8)  # one padded batch: the unpadded path
  assert st_emb.shape == (3, cfg.hidden_size)
  np.testing.assert_allclose(np.linalg.norm(st_emb, axis=-1), 1.0, atol=1e-5)
  # Our embed command's encoder on the same directory (JAX, mean pooling, normalised).
  encoder = embed.Encoder.load(str(st_dir), tokenizer=bert_tokenizer, normalize=True, max_length=32, batch_size=8)
  np.testing.assert_allclose(encoder.encode(texts), st_emb, atol=1e-4)

  code, out = run_job(capsys, convert_job.to_onnx, st_dir, tmp_path / 'onnx', opset=18)
  assert code == 0, out
  written = tmp_path / 'onnx'
  assert 'Attention' not in op_types(written)  # the portable graph: basic ops only
  assert '(embedding)' in out and (written / 'tokenizer.json').is_file()
  assert (written / 'modules.json').is_file() and (written / '1_Pooling' / 'config.json').is_file()
  session = ort.InferenceSession(str(written / 'onnx/model.onnx'), providers=['CPUExecutionProvider'])
  assert [o.name for o in session.get_outputs()] == ['last_hidden_state', 'sentence_embedding']
  features = st.tokenize(texts)
  hidden, got = session.run(
    None, {'input_ids': features['input_ids'].numpy(), 'attention_mask': features['attention_mask'].numpy()}
  )
  close(got, st_emb)
  tokens = st[0].auto_model(**features).last_hidden_state.detach().numpy()  # what sentence-transformers pools
  close(hidden, tokens)


def test_to_onnx_errors_are_one_line(flat, tmp_path, capsys):
  cfg, params = flat
  code, out = run_job(capsys, convert_job.to_onnx, tmp_path / 'missing', tmp_path / 'o')
  assert code == errors.ExportError.exit_status and out.count('\n') == 1 and 'no such directory' in out
  from neobert_jax.finetune import export as finetune_export

  base = tmp_path / 'base'
  state = finetune_export.encoder_state_dict(params, cfg)
  export_hf.write_hf_dir(base, {k[len(hf.HF_PREFIX) :]: v for k, v in state.items()}, hf.hf_config_dict(cfg))
  code, out = run_job(capsys, convert_job.to_onnx, base, tmp_path / 'o', task='mlm')
  assert code == errors.ExportError.exit_status and out.count('\n') == 1 and 'no MLM decoder' in out
  assert not (tmp_path / 'o').exists()
  (tmp_path / 'o').mkdir()
  (tmp_path / 'o' / 'x').write_text('keep')
  code, out = run_job(capsys, convert_job.to_onnx, base, tmp_path / 'o', task='hidden')
  assert code == errors.ExportError.exit_status and 'not empty' in out
