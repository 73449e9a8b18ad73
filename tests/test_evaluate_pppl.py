"""Batched, static-shape pseudo-perplexity equals a slow one-token-at-a-time reference."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from neobert_jax.evaluate import pppl as pppl_lib
from neobert_jax.jobs import evaluate as evaluate_job
from neobert_jax.downstream import batching
from neobert_jax import sharding as shd
from neobert_jax.model import NeoBERTForMLM, default_model_config
from neobert_jax.weights.flat import sharded_params, to_flat

MASK, PAD = 103, 0


def _model_cfg():
  m = default_model_config()
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 32, 2, 2, 96
  return m


def _reference(model, seqs):
  """Mask one token, run the unpadded text alone, read -log p of the hidden token; repeat for every token."""
  graphdef, weights = nnx.split(model)
  forward = jax.jit(lambda w, ids: nnx.merge(graphdef, w)(ids))  # compiled per length; one text per call
  out = []
  for s in seqs:
    nll = []
    for p in range(1, len(s) - 1):
      ids = np.array(s)
      ids[p] = MASK
      logits = forward(weights, jnp.asarray(ids)[None])[0, p]
      nll.append(-float(jax.nn.log_softmax(logits)[s[p]]))
    out.append(nll)
  return out


@pytest.mark.slow
def test_batched_pppl_equals_slow_reference():
  cfg = _model_cfg()
  model = NeoBERTForMLM(cfg, rngs=nnx.Rngs(1))
  rng = np.random.default_rng(0)
  seqs = [np.concatenate([[101], rng.integers(1000, 30000, n), [102]]).astype(np.int32) for n in (3, 14, 29, 1, 9)]
  mesh = shd.inference_mesh()
  graphdef, params, shardings = sharded_params(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)), to_flat(model), mesh)
  score = pppl_lib.jit_scorer(graphdef, shardings, mesh)
  got = pppl_lib.pseudo_perplexity(score, params, seqs, MASK, PAD, 16, batching.buckets(64), mesh)
  ref = _reference(model, seqs)
  flat_ref = np.concatenate(ref)
  assert got.tokens == len(flat_ref) == 3 + 14 + 29 + 1 + 9
  assert got.pppl == pytest.approx(math.exp(flat_ref.mean()), rel=1e-5)
  for doc, r in zip(got.per_document, ref):
    assert doc['tokens'] == len(r) and doc['nll'] == pytest.approx(np.mean(r), rel=1e-5)


def test_the_job_on_an_hf_dir(tmp_path):
  from neobert_jax.convert.export_hf import export_flat

  cfg = _model_cfg()
  export_flat(to_flat(NeoBERTForMLM(cfg, rngs=nnx.Rngs(0))), cfg, tmp_path / 'hf', tokenizer='bert-base-uncased')
  (tmp_path / 'in.txt').write_text('the cat sat on the mat.\n\nmarkets fell sharply on monday.\n')
  result = evaluate_job.pppl(
    str(tmp_path / 'hf'),
    str(tmp_path / 'in.txt'),
    max_length=32,
    batch_size=8,
    progress=False,
    per_document=str(tmp_path / 'docs.jsonl'),
  )
  assert result['documents'] == 2 and result['pppl'] > 1
  docs = [json.loads(line) for line in (tmp_path / 'docs.jsonl').read_text().splitlines()]
  assert sum(d['tokens'] for d in docs) == result['tokens']
