"""The README's main job, shortened, where pods run it: the tiny config on the built-in corpus, with its workdir, its
prepared data and its export all on gs:// (a real GCS server on 127.0.0.1, tests/conftest.py). It learns, exits
clean with every output the README lists, and the run it leaves is self-contained: fine-tuning, embedding,
evaluation and export from it work in an empty cache, as on another machine, with their outputs on the bucket too.
"""

import csv
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from etils import epath

from neobert_jax import config as config_lib
from neobert_jax import paths
from neobert_jax.jobs import pretrain as pretrain_job
from neobert_jax.train import report
from neobert_jax.weights import runs
from tests.support.tiny_train import REPO_ROOT

pytestmark = [pytest.mark.server, pytest.mark.slow]

# What the README's table says a pretraining workdir holds when the job ends (checkpoints, config and history,
# metrics and TensorBoard, the loss curve and its plot, the export when export.hf_dir is inside the workdir), and
# the tokenizer the run carries: exactly these names, local or on a bucket.
MAIN_JOB_OUTPUTS = {
  'checkpoints',
  'checkpoint_metrics.jsonl',
  'config.json',
  'config_history.jsonl',
  'metrics.jsonl',
  'tensorboard',
  'loss_curve.md',
  'loss_curve.png',
  'report.json',
  'tokenizer',
  'hf',
}


def _main_job_config(run: str) -> object:
  return config_lib.load(
    REPO_ROOT / 'configs' / 'tiny_cpu.py',
    {
      'train.num_steps': 40,
      'eval.every_steps': 40,
      'eval.num_batches': 2,
      'checkpoint.every_steps': 40,
      'logging.progress_bar': False,
      'logging.peak_flops_per_device': 1e11,
      'export.hf_dir': f'{run}/hf',
      'eval.probe_train_size': 256,  # the recipe's probe, on a smaller sample
      'eval.probe_test_size': 256,
    },
  )


@pytest.fixture(scope='module')
def main_job(gcs):
  """The main job with data, workdir and export on the bucket: (run URL, RunResult)."""
  from neobert_jax.data import pipeline  # pylint: disable=g-import-not-at-top

  run = f'{gcs}/main/run'
  cfg = _main_job_config(run)
  pipeline.prepare_builtin(cfg.data, cfg.model.max_length)  # the built-in corpus, then published to the bucket
  local_data, _ = pipeline.open_prepared(cfg.data, cfg.model.max_length)
  cfg.data.dir = f'{gcs}/main/data'
  paths.publish_dir(local_data, epath.Path(cfg.data.dir), 'manifest.json')
  return run, cfg, pretrain_job.pretrain(cfg, run)  # what the train command runs: train, export, report


def test_the_main_job_learns_on_a_bucket_and_exports_there(main_job):
  run, _, result = main_job
  first, last = result.evals[0], result.evals[-1]
  assert (first['step'], last['step']) == (0, 40)
  assert first['loss'] > 7.4  # ~ln(2048) = 7.62 at init: the corpus's own 2048-piece vocabulary
  assert last['loss'] < first['loss'] - 0.6, result.evals  # measured: 8.07 -> ~6.5 after 40 steps
  hf = paths.local_copy(f'{run}/hf', marker='config.json')
  assert json.loads((hf / 'config.json').read_text())['vocab_size'] == 2048
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  ids = AutoTokenizer.from_pretrained(hf)('The king is dead.')['input_ids']
  assert ids[0] == 2 and ids[-1] == 3 and len(ids) > 4  # [CLS] ... [SEP] of builtin-wordpiece-2048
  assert result.report['unigram']['held_out'] > 5.0
  filled = result.report['fill_mask']  # one token blanked per row, one whole word, one token of a sentence alone
  for kind in ('tokens', 'words', 'sentences'):
    assert filled[kind]['n'] == 200 and 0 <= filled[kind]['first'] <= filled[kind]['top5'] <= 200, filled
  assert 3.0 < result.report['neighbours']['loss'] < result.report['unigram']['held_out']
  assert 0 < last['probe/fine_food/accuracy'] <= 1
  start = runs.loss_curve(paths.resolve(run))[0]  # step 0 of a fresh start: the random init the reference scored
  assert (
    start['probe/fine_food/accuracy']
    == start['probe/fine_food/random_init_accuracy']
    == first['probe/fine_food/accuracy']
  )
  # The export's model card, refreshed after the report: the final held-out loss, the baselines, the curve.
  from huggingface_hub import ModelCard  # pylint: disable=g-import-not-at-top

  card = ModelCard.load(hf / 'README.md')
  shipped = report.shipped(result.evals, runs.EMA_ITEM)[-1]  # the recipe exports the moving average
  assert shipped['step'] == 40 and shipped['loss'] != last['loss']
  assert {r.metric_type: r.metric_value for r in card.data.eval_results}['loss'] == round(shipped['loss'], 4)
  assert result.report['eval_loss'] == shipped['loss']
  assert (
    f'| neighbour counts (bigrams of the training split) | {result.report["neighbours"]["loss"]:.3f} |' in card.text
  )
  assert (hf / 'loss_curve.png').read_bytes() == paths.resolve(f'{run}/loss_curve.png').read_bytes()


def test_the_bucket_workdir_holds_every_output_of_a_local_run(main_job):
  run = paths.resolve(main_job[0])
  assert {p.name for p in run.iterdir()} == MAIN_JOB_OUTPUTS
  png = (run / 'loss_curve.png').read_bytes()
  assert png.startswith(b'\x89PNG') and len(png) > 10_000
  table = (run / 'loss_curve.md').read_text()
  assert 'neighbour counts' in table and '| 40 |' in table
  assert [p.name for p in (run / 'tokenizer').iterdir()] == ['tokenizer.json']
  assert (run / 'tensorboard').is_dir() and len((run / 'metrics.jsonl').read_text().splitlines()) >= 3


def test_the_same_command_on_the_finished_run_only_exports_again(main_job):
  run, cfg, _ = main_job
  (paths.resolve(run) / 'hf' / 'config.json').unlink()
  again = pretrain_job.pretrain(cfg, run)
  assert again.final_step == 40 and not again.evals and (paths.resolve(run) / 'hf' / 'config.json').is_file()


# Another machine's process: every job the README names after pretraining, from the run on the bucket, in one fresh
# process (one start-up) whose cache is empty: fine-tuning with its export, a one-point sweep, embedding, pseudo-
# perplexity and the conversion, each writing to the bucket. The commands' flags and one-line errors are tested
# beside (test_cli_errors.py, test_cli_convention.py).
_ANOTHER_MACHINE = """
import sys
from neobert_jax import config as config_lib, embed
from neobert_jax.jobs import finetune as finetune_job
from neobert_jax.jobs import convert, evaluate

run, bucket = sys.argv[1:3]
cfg = config_lib.load('configs/finetune_classification.py', {
  'init.from_checkpoint': run,
  'data.train_file': f'{bucket}/ft/train.csv',
  'data.validation_fraction': 0.25,
  'train.epochs': 1,
  'logging.progress_bar': False,
})
cfg.export.dir = f'{bucket}/ft/hf'
finetune_job.finetune(cfg, f'{bucket}/ft/run')
cfg.export.dir = ''
# the point is the fine-tuning's own rate, batch and decay: its train step is read back from the compilation cache
finetune_job.run_sweep(cfg, f'{bucket}/sweep', [2e-5], [32], [1e-2])
assert embed.main([f'--model={run}', f'--input={bucket}/texts.txt', f'--output={bucket}/emb.npy', '--no-progress']) == 0
evaluate.pppl(run, f'{bucket}/texts.txt', per_document=f'{bucket}/pppl.jsonl', progress=False)
convert.to_pytorch(run, f'{bucket}/hf2')
"""


def test_fine_tuning_a_sweep_embedding_evaluation_and_export_from_the_bucket_run_in_an_empty_cache(main_job, tmp_path):
  """Another machine: nothing of the run's tokenizer or data in its cache. Every job reads the run from the bucket,
  takes the tokenizer the run carries, and writes its outputs to the bucket."""
  from neobert_jax.data import labelled  # pylint: disable=g-import-not-at-top
  from neobert_jax.jobs import finetune as finetune_job  # pylint: disable=g-import-not-at-top

  run = main_job[0]
  bucket = run.rsplit('/', 1)[0]
  texts, labels = labelled.read_split('fine_food', 'train')
  rows = io.StringIO()
  writer = csv.writer(rows)
  writer.writerow(['text', 'label'])
  writer.writerows(zip(texts[:192], labels[:192]))
  paths.write_text(paths.resolve(f'{bucket}/ft/train.csv'), rows.getvalue())
  paths.write_text(paths.resolve(f'{bucket}/texts.txt'), '\n'.join(texts[:12]) + '\n')
  cache = tmp_path / 'empty-cache'
  cache.mkdir()
  env = {**os.environ, 'NEOBERT_JAX_CACHE': str(cache), 'JAX_PLATFORMS': 'cpu'}
  done = subprocess.run(
    [sys.executable, '-c', _ANOTHER_MACHINE, run, bucket],
    cwd=REPO_ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]

  ft = paths.resolve(f'{bucket}/ft/run')
  results = json.loads((ft / 'results.json').read_text())
  assert 0 <= results['best']['metrics'][results['metric']] <= 1
  assert [p.name for p in (ft / 'tokenizer').iterdir()] == ['tokenizer.json']  # the fine-tuned run carries it too
  assert (ft / 'labels.json').is_file()
  assert (paths.resolve(f'{bucket}/ft/hf') / 'tokenizer.json').is_file()
  root = paths.resolve(f'{bucket}/sweep')
  summary = json.loads((root / finetune_job.SUMMARY_FILE).read_text())
  assert len(summary['rows']) == 1 and (root / finetune_job.point_name(2e-5, 32, 1e-2) / 'results.json').is_file()
  emb = np.load(io.BytesIO(paths.resolve(f'{bucket}/emb.npy').read_bytes()))
  assert emb.shape == (12, 128) and np.isfinite(emb).all()
  per_document = paths.resolve(f'{bucket}/pppl.jsonl').read_text().splitlines()
  assert len(per_document) == 12 and all(json.loads(line)['nll'] > 0 for line in per_document)
  hf2 = paths.resolve(f'{bucket}/hf2')
  assert (hf2 / 'tokenizer.json').read_bytes() == (paths.resolve(run) / 'hf' / 'tokenizer.json').read_bytes()
  assert not (cache / 'vocab').exists()  # nothing was learned or fetched again: the run's own file was used
