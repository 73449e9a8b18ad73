"""The README's main job, shortened: the tiny config on the built-in corpus learns, and exports to Hugging Face."""

import json

import pytest

from neobert_jax.train import __main__ as train_command
from neobert_jax import config as config_lib
from support.tiny_train import REPO_ROOT


@pytest.mark.slow
def test_tiny_config_learns_on_real_text_and_exports(tmp_path):
  cfg = config_lib.load(
    REPO_ROOT / 'configs' / 'tiny_cpu.py',
    {
      'train.num_steps': 40,
      'eval.every_steps': 40,
      'eval.num_batches': 2,
      'checkpoint.every_steps': 40,
      'logging.progress_bar': False,
      'logging.peak_flops_per_device': 1e11,
      'export.hf_dir': str(tmp_path / 'hf'),
      'eval.probe_train_size': 256,  # the recipe's probe, on a smaller sample
      'eval.probe_test_size': 256,
    },
  )
  result = train_command.pretrain(cfg, tmp_path / 'run')  # what the train command runs: train, export, report
  first, last = result.evals[0], result.evals[-1]
  assert (first['step'], last['step']) == (0, 40)
  assert first['loss'] > 7.4  # ~ln(2048) = 7.62 at init: the corpus's own 2048-piece vocabulary
  assert last['loss'] < first['loss'] - 0.6, result.evals  # measured: 7.65 -> ~6.7 after 40 steps
  hf = tmp_path / 'hf'
  assert (hf / 'config.json').is_file() and (hf / 'model.safetensors').is_file()
  assert json.loads((hf / 'config.json').read_text())['vocab_size'] == 2048
  # The export carries the vocabulary the run was trained with, and it frames text as the training rows are.
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  ids = AutoTokenizer.from_pretrained(hf)('The king is dead.')['input_ids']
  assert ids[0] == 2 and ids[-1] == 3 and len(ids) > 4  # [CLS] ... [SEP] of builtin-wordpiece-2048
  assert result.report['unigram']['held_out'] > 5.0
  filled = result.report['fill_mask']  # one token blanked per row, one whole word, one token of a sentence alone
  for kind in ('tokens', 'words', 'sentences'):
    assert filled[kind]['n'] == 200 and 0 <= filled[kind]['first'] <= filled[kind]['top5'] <= 200, filled
  assert 3.0 < result.report['neighbours']['loss'] < result.report['unigram']['held_out']
  assert (tmp_path / 'run' / 'loss_curve.png').is_file() and 0 < last['probe/fine_food/accuracy'] <= 1
  assert (tmp_path / 'run' / 'tensorboard').is_dir() and (tmp_path / 'run' / 'metrics.jsonl').is_file()
  # The export's model card, refreshed after the report: the final held-out loss, the baselines, the curve.
  from huggingface_hub import ModelCard  # pylint: disable=g-import-not-at-top

  card = ModelCard.load(hf / 'README.md')
  assert {r.metric_type: r.metric_value for r in card.data.eval_results}['loss'] == round(last['loss'], 4)
  assert (
    f'| neighbour counts (bigrams of the training split) | {result.report["neighbours"]["loss"]:.3f} |' in card.text
  )
  assert (hf / 'loss_curve.png').read_bytes() == (tmp_path / 'run' / 'loss_curve.png').read_bytes()
  # The same command on the finished run trains nothing and only exports again.
  (hf / 'config.json').unlink()
  again = train_command.pretrain(cfg, tmp_path / 'run')
  assert again.final_step == 40 and not again.evals and (hf / 'config.json').is_file()
