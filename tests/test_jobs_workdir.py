"""A job resolves its workdir once (paths.resolve: ~, the URL scheme, an absolute path) and hands the resolved path
down: nothing below a job resolves the workdir again."""

import json
import os

import pytest

from neobert_jax import paths
from neobert_jax.config.finetune import base_config
from neobert_jax.jobs import finetune as finetune_job
from neobert_jax.jobs import pretrain as pretrain_job
from tests.support.tiny_train import tiny_config


@pytest.fixture
def resolutions(monkeypatch):
  """The paths given to paths.resolve during the test, as given."""
  seen, resolve = [], paths.resolve

  def counted(path, what='path'):
    seen.append(os.fspath(path))
    return resolve(path, what)

  monkeypatch.setattr(paths, 'resolve', counted)
  return seen


def _of(seen: list[str], workdir) -> int:
  return sum(os.path.abspath(p) == os.path.abspath(workdir) for p in seen if not paths.is_url(p))


def test_the_pretraining_job_resolves_its_workdir_once(tmp_path, resolutions):
  result = pretrain_job.pretrain(tiny_config(steps=2), str(tmp_path / 'run'))
  assert result.final_step == 2
  assert _of(resolutions, tmp_path / 'run') == 1, resolutions


def test_the_finetuning_job_resolves_its_workdir_once(tmp_path, resolutions):
  rows = [{'text': f'{w} house river', 'label': w} for w in ('good', 'bad') * 16]
  (tmp_path / 'train.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  cfg = base_config('classification')
  m = cfg.model
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 32, 1, 2, 64
  cfg.data.train_file, cfg.data.max_length, cfg.data.validation_fraction = str(tmp_path / 'train.jsonl'), 16, 0.25
  cfg.train.batch_size, cfg.train.num_steps, cfg.train.eval_batch_size = 8, 2, 8
  cfg.logging.progress_bar = False
  results = finetune_job.finetune(cfg, str(tmp_path / 'run'))
  assert results['num_steps'] == 2
  assert _of(resolutions, tmp_path / 'run') == 1, resolutions
