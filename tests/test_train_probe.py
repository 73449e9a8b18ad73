"""The pretraining probe (train/probe.py): the logistic regression, the framing of examples, and pooled embeddings
that ignore padding, on the real labelled task it ships with (data/labelled.py)."""

import numpy as np
import pytest
from flax import nnx

from neobert_jax import config as config_lib
from neobert_jax import sharding as shd
from neobert_jax.config import train as train_config
from neobert_jax.data import labelled
from neobert_jax.errors import ConfigError
from neobert_jax.train import mlm
from neobert_jax.train import probe as probe_lib
from tests.support.tiny_train import REPO_ROOT


def test_logistic_regression_separates_what_is_separable_and_not_what_is_noise():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(400, 8))
  y = (x[:, 0] + 0.5 * x[:, 3] > 0).astype(int)
  assert probe_lib.fit_and_score(x[:300], y[:300], x[300:], y[300:]) >= 0.95
  noise = rng.integers(0, 3, 400)
  assert probe_lib.fit_and_score(x[:300], noise[:300], x[300:], noise[300:]) < 0.5  # 3 classes: chance is 1/3


def test_fine_food_is_the_amazon_reviews_split_as_published():
  texts, labels = labelled.read_split('fine_food', 'test')
  assert len(texts) == 1000 and labels.count('great') == 658 and set(labels) == {'great', 'other'}
  assert len(labelled.read_split('fine_food', 'train')[0]) == 4000


def test_tweet_source_is_android_against_iphone_tweets_without_retweets():
  texts, labels = labelled.read_split('tweet_source', 'test')
  assert len(texts) == 1000 and labels.count('android') == 519 and set(labels) == {'android', 'iphone'}
  train, _ = labelled.read_split('tweet_source', 'train')
  assert len(train) == 4000
  assert set(train) & set(texts) == {'MAKE AMERICA GREAT AGAIN!'}  # split by tweet: only a slogan he tweeted twice
  assert not any(t.startswith('RT @') for t in train + texts)  # retweets left out


@pytest.mark.parametrize(
  'task, train_size, label, count',
  [('bird_strike', 4000, 'arriving', 571), ('course_level', 2034, 'undergraduate', 558)],
)
def test_distinct_text_tasks_split_by_text_with_one_label_each(task, train_size, label, count):
  texts, labels = labelled.read_split(task, 'test')
  assert len(texts) == 1000 and labels.count(label) == count and len(set(labels)) == 2
  train, train_labels = labelled.read_split(task, 'train')
  assert len(train) == train_size and set(train_labels) == set(labels)
  lowered = [t.lower() for t in train + texts]
  assert len(set(lowered)) == len(lowered) and all(t.strip() for t in lowered)  # each text once, none empty


def _tiny_cfg(**probe):
  overrides = {
    'model.dtype': 'float32',
    'model.hidden_size': 32,
    'model.num_heads': 2,
    'model.intermediate_size': 64,
    'model.max_length': 32,
  }
  overrides.update({'data.max_predictions': 16, 'eval.probe_task': 'fine_food', **probe})
  cfg = config_lib.load(REPO_ROOT / 'configs' / 'tiny_cpu.py', overrides)
  cfg.data.tokenizer = 'builtin-wordpiece-2048'
  return train_config.validate_train(cfg)


def test_pooled_embeddings_ignore_padding_and_the_probe_scores_a_random_init():
  cfg = _tiny_cfg(**{'eval.probe_train_size': 64, 'eval.probe_test_size': 40})
  mesh = shd.make_mesh(dict(cfg.mesh))
  defs, state = mlm.create_train_state(cfg, mesh)
  probe = probe_lib.Probe(cfg, mesh, defs.model_def, defs.shardings['params'])
  ids, lengths = probe.inputs['test']
  assert ids.shape == (40, 32) and (ids[:, 0] == 2).all() and (ids[np.arange(40), lengths - 1] == 3).all()
  pooled = probe._embed(state['params'], 'test')  # pylint: disable=protected-access
  model = nnx.merge(defs.model_def, state['params'])
  for i in (0, int(np.argmin(lengths))):  # each row alone, unpadded, through the plain encoder
    alone = np.asarray(model.encoder(ids[i : i + 1, : lengths[i]]))[0].mean(0)
    np.testing.assert_allclose(pooled[i], alone, rtol=1e-4, atol=1e-5)
  assert 0.0 <= probe(state['params'])['accuracy'] <= 1.0


@pytest.mark.parametrize(
  'overrides, message',
  [
    ({'eval.probe_task': 'imdb'}, "eval.probe_task='imdb' is unknown"),
    ({'eval.probe_task': 'fine_food', 'eval.probe_train_size': 1}, 'eval.probe_train_size must be >= 2'),
  ],
)
def test_a_probe_that_cannot_run_is_one_line(overrides, message):
  cfg = config_lib.load(REPO_ROOT / 'configs' / 'tiny_cpu.py', overrides)
  with pytest.raises(ConfigError, match=message):
    train_config.validate_train(cfg)


def test_evaluation_masks_at_its_own_rate_when_given_one():
  from neobert_jax.data import pipeline  # pylint: disable=g-import-not-at-top

  cfg = _tiny_cfg(**{'data.mask_rate': 0.15, 'eval.mask_rate': 0.5, 'eval.probe_task': '', 'data.max_predictions': 32})
  assert train_config.eval_mask_rate(cfg) == 0.5 and train_config.eval_data_config(cfg).mask_rate == 0.5
  held = train_config.eval_data_config(cfg)
  pipeline.prepare_builtin(held, 128)  # the main job's rows: tokenized once per machine, shared with its tests
  held.max_predictions = 128  # no cap: every chosen token is a slot
  batch = next(iter(pipeline.make_eval_iterator(held, 8, 128, num_batches=1)))
  real = batch['segment_ids'] > 0
  assert abs(batch['mlm_weights'].sum() / real.sum() - 0.5) < 0.1  # [CLS]/[SEP] are never masked
  assert train_config.eval_mask_rate(_tiny_cfg(**{'data.mask_rate': 0.15, 'eval.probe_task': ''})) == 0.15
  with pytest.raises(ConfigError, match='eval.mask_rate=1.0 must be in'):
    _tiny_cfg(**{'eval.mask_rate': 1.0})
