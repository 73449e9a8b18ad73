"""A run that ships its moving average (export.use_ema): everything that reads the run reads the average. Its
held-out curve, report line and model card quote eval/ema/*, a later start from it (fine-tuning, a new stage,
`--model`) loads the average, and a stage that keeps its optimizer loads the parameters that state belongs to."""

import json

import numpy as np
import pytest

from neobert_jax.convert import model_card
from neobert_jax.train import report
from neobert_jax.weights import runs
from neobert_jax.weights import source as source_lib
from tests.support.tiny_train import tiny_config, train_only

STEPS = 4


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  cfg = tiny_config(steps=STEPS)
  cfg.train.ema_decay, cfg.export.use_ema = 0.5, True
  cfg.eval.every_steps, cfg.eval.num_batches = 2, 1
  cfg.checkpoint.async_save = False
  workdir = tmp_path_factory.mktemp('shipped')
  result = train_only(cfg, workdir)
  assert result.final_step == STEPS
  return workdir, result


def _metrics(workdir):
  return [json.loads(line) for line in (workdir / runs.METRICS_FILE).read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_the_curve_and_the_report_are_the_averages(run, tmp_path):
  workdir, result = run
  ema = {r['step']: r['eval/ema/loss'] for r in _metrics(workdir) if 'eval/ema/loss' in r}
  params = {r['step']: r['eval/loss'] for r in _metrics(workdir) if 'eval/loss' in r}
  assert ema[STEPS] != params[STEPS]  # the average lags the weights: the two curves differ
  curve = {r['step']: r for r in runs.loss_curve(workdir, runs.exported_item(result.config)) if 'eval' in r}
  assert {s: r['eval'] for s, r in curve.items()} == ema
  assert {s: r['params_eval'] for s, r in curve.items()} == params
  assert [r['eval'] for r in runs.loss_curve(workdir) if 'eval' in r] == [params[s] for s in sorted(params)]
  shipped = report.shipped(result.evals, runs.EMA_ITEM)
  assert [e['loss'] for e in shipped] == [ema[s] for s in sorted(ema)]
  assert report.shipped(result.evals, runs.PARAMS_ITEM)[-1]['loss'] == params[STEPS]
  table = report.write_table(workdir, None, 1000, runs.EMA_ITEM).read_text()
  assert 'held-out loss (moving average)' in table and 'held-out loss (parameters)' in table
  assert f'| {STEPS} | ' in table and f'{ema[STEPS]:.3f} |' in table and f'{params[STEPS]:.3f} |' in table
  card = model_card.run_facts(workdir)  # the run's own choice: the average
  assert card.eval_results[0]['metric_value'] == round(ema[STEPS], 4)
  assert model_card.run_facts(workdir, item=runs.PARAMS_ITEM).eval_results[0]['metric_value'] == round(params[STEPS], 4)


@pytest.mark.slow
def test_a_start_from_the_run_loads_the_average_and_a_kept_optimizer_the_parameters(run):
  workdir, _ = run
  ema = runs.restore_params(workdir, None, runs.EMA_ITEM)[1]
  params = runs.restore_params(workdir)[1]
  src = source_lib.from_init(str(workdir), '', -1)
  assert src.item == runs.EMA_ITEM and src.step == STEPS
  for k in ema:
    np.testing.assert_array_equal(src.flat[k], ema[k], err_msg=k)
  raw = source_lib.from_init(str(workdir), '', -1, raw=True)
  assert raw.item == runs.PARAMS_ITEM
  for k in params:
    np.testing.assert_array_equal(raw.flat[k], params[k], err_msg=k)
  assert any(not np.array_equal(ema[k], params[k]) for k in ema)  # so the two loads are told apart
  assert source_lib.open_source(str(workdir)).item == runs.EMA_ITEM  # `--model RUN` too


def test_a_run_without_export_use_ema_ships_its_parameters():
  cfg = tiny_config()
  assert runs.exported_item(cfg) == runs.PARAMS_ITEM
  assert runs.exported_item({'model': {}}) == runs.PARAMS_ITEM  # a record from before the export section
  cfg.train.ema_decay, cfg.export.use_ema = 0.9, True
  assert runs.exported_item(cfg) == runs.EMA_ITEM
  assert runs.exported_item(json.loads(cfg.to_json())) == runs.EMA_ITEM  # config.json as a plain dict
