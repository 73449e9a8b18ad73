"""train.ema_decay: the moving average of the parameters follows its formula step by step, is checkpointed and
resumes bit-identical, is evaluated beside the weights (eval/ema/*) and is what export.use_ema and `convert
to-pytorch --use-ema` write."""

import json

import numpy as np
import pytest

from neobert_jax import errors
from neobert_jax.config import train as config_lib
from neobert_jax.jobs import convert as convert_job
from neobert_jax.jobs import pretrain as pretrain_job
from tests.support.tiny_train import assert_resumes_identically, tiny_config, train_only
from neobert_jax.weights import hf, runs

STEPS, DECAY = 4, 0.5  # a fast average: four steps move it visibly


def _cfg():
  cfg = tiny_config(steps=STEPS)
  cfg.train.ema_decay = DECAY
  cfg.eval.every_steps, cfg.eval.num_batches = 2, 1
  cfg.checkpoint.every_steps, cfg.checkpoint.keep, cfg.checkpoint.async_save = 1, 10, False
  return cfg


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('ema')
  assert train_only(_cfg(), workdir).final_step == STEPS
  return workdir


@pytest.mark.slow
def test_the_average_follows_its_formula_and_is_evaluated(run):
  ema = runs.restore_params(run, 0 + 1, runs.EMA_ITEM)[1]
  for step in range(1, STEPS + 1):
    params = runs.restore_params(run, step)[1]
    if step > 1:
      ema = {k: np.float32(DECAY) * ema[k] + np.float32(1 - DECAY) * params[k] for k in params}
    saved = runs.restore_params(run, step, runs.EMA_ITEM)[1]
    for k in params:
      np.testing.assert_allclose(saved[k], ema[k], rtol=1e-6, atol=1e-7, err_msg=(step, k))
  last = runs.restore_params(run)[1]
  assert any(not np.array_equal(saved[k], last[k]) for k in last)  # the average lags the weights
  rows = [json.loads(line) for line in (run / 'metrics.jsonl').read_text().splitlines()]
  evals = {r['step']: r for r in rows if 'eval/loss' in r}
  ema_evals = {r['step']: r for r in rows if 'eval/ema/loss' in r}
  assert sorted(evals) == sorted(ema_evals) == [2, 4]
  assert all(np.isfinite(r['eval/ema/loss']) and 0 <= r['eval/ema/accuracy'] <= 1 for r in ema_evals.values())
  assert ema_evals[4]['eval/ema/loss'] != evals[4]['eval/loss']


@pytest.mark.slow
def test_a_run_resumed_mid_way_ends_with_the_same_average_bit_for_bit(run, tmp_path):
  assert_resumes_identically(run, tmp_path / 'run', 2, _cfg())  # as if killed after step 2's checkpoint


@pytest.mark.slow
def test_export_use_ema_and_convert_use_ema_write_the_average(run, tmp_path):
  cfg = _cfg()
  cfg.export.hf_dir, cfg.export.use_ema = str(tmp_path / 'job'), True
  pretrain_job.export(cfg, run)
  convert_job.to_pytorch(str(run), str(tmp_path / 'cli'), use_ema=True)
  ema = runs.restore_params(run, None, runs.EMA_ITEM)[1]
  for out in ('job', 'cli'):
    _, flat = hf.read_hf_dir(tmp_path / out)
    for k in ema:
      np.testing.assert_array_equal(flat[k], ema[k], err_msg=(out, k))


def test_ema_fields_are_checked():
  cfg = tiny_config()
  cfg.train.ema_decay = 1.0
  with pytest.raises(errors.ConfigError, match=r'train.ema_decay=1.0 must be in \[0, 1\)'):
    config_lib.validate_train(cfg, num_devices=8)
  cfg.train.ema_decay, cfg.export.use_ema = 0.0, True
  with pytest.raises(errors.ConfigError, match='export.use_ema=True .* set train.ema_decay > 0'):
    config_lib.validate_train(cfg, num_devices=8)
