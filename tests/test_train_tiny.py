"""The README's main job, shortened: the tiny config on the built-in corpus learns, and exports to Hugging Face."""

import json

from neobert_jax import pretrain
from neobert_jax.train import config as config_lib


def test_tiny_config_learns_on_real_text_and_exports(tmp_path):
  cfg = config_lib.load_config(str(config_lib.REPO_ROOT / 'configs' / 'tiny_cpu.py'), {
      'train.num_steps': 40, 'eval.every_steps': 40, 'eval.num_batches': 2, 'checkpoint.every_steps': 40,
      'logging.progress_bar': False, 'logging.peak_flops_per_device': 1e11,
      'export.hf_dir': str(tmp_path / 'hf')})
  result = pretrain.run(cfg, tmp_path / 'run')  # what the train command runs: train, export, report
  first, last = result.evals[0], result.evals[-1]
  assert (first['step'], last['step']) == (0, 40)
  assert first['loss'] > 10.0  # ~ln(30522) = 10.3 at init
  assert last['loss'] < first['loss'] - 2.0, result.evals  # measured: 10.3 -> ~7.6 after 40 steps
  hf = tmp_path / 'hf'
  assert (hf / 'config.json').is_file() and (hf / 'model.safetensors').is_file()
  assert json.loads((hf / 'config.json').read_text())['vocab_size'] == 30522
  assert (tmp_path / 'run' / 'tensorboard').is_dir() and (tmp_path / 'run' / 'metrics.jsonl').is_file()
  # The same command on the finished run trains nothing and only exports again.
  (hf / 'config.json').unlink()
  again = pretrain.run(cfg, tmp_path / 'run')
  assert again.final_step == 40 and not again.evals and (hf / 'config.json').is_file()
