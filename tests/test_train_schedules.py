"""The learning rate a run logs is the schedule's formula: a WSD run with a 1-sqrt decay to zero, read back from
metrics.jsonl at its plateau, mid-decay and at its end."""

import json

import numpy as np
import pytest

from neobert_jax.train import loop
from neobert_jax.train.testing import tiny_config

STEPS, WARMUP, DECAYING, PEAK = 10, 2, 4, 2e-3  # updates 6..9 decay; metrics.jsonl logs update t as step t + 1


def _formula(logged_step: int) -> float:
  """WSD by the book, on the logged step s (updates done): linear warmup, the peak, then 1 - sqrt(progress) over
  the last DECAYING steps, reaching 0 at s = STEPS."""
  t = logged_step - 1  # the update that step logged
  if t < WARMUP:
    return PEAK * t / WARMUP
  progress = max(logged_step - (STEPS - DECAYING), 0) / DECAYING
  return PEAK * (1.0 - np.sqrt(progress))


@pytest.mark.slow
def test_logged_learning_rate_of_a_wsd_1_sqrt_run_is_the_formula(tmp_path):
  cfg = tiny_config(steps=STEPS)
  o = cfg.optimizer
  o.schedule, o.decay_shape, o.wsd_decay_fraction, o.final_lr_fraction = 'wsd', '1-sqrt', DECAYING / STEPS, 0.0
  o.peak_lr, o.warmup_steps = PEAK, WARMUP
  assert loop.run(cfg, tmp_path).final_step == STEPS
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  lr = {row['step']: row['train/learning_rate'] for row in rows if 'train/learning_rate' in row}
  assert sorted(lr) == list(range(1, STEPS + 1))
  for step in lr:
    assert lr[step] == np.float32(_formula(step)), step
  plateau, mid, end = lr[5], lr[8], lr[STEPS]
  assert plateau == np.float32(PEAK)
  assert mid == np.float32(PEAK * (1 - np.sqrt(0.5))) and 0 < mid < PEAK
  assert end == 0.0


def test_the_250m_recipe_offers_a_linear_decay_to_zero_and_keeps_the_papers_cosine():
  import importlib.util  # pylint: disable=g-import-not-at-top

  from neobert_jax.engine import optimizer  # pylint: disable=g-import-not-at-top
  from neobert_jax.train.testing import REPO_ROOT  # pylint: disable=g-import-not-at-top

  spec = importlib.util.spec_from_file_location('_neobert_250m_d2z', REPO_ROOT / 'configs' / 'neobert_250m.py')
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  paper, d2z = recipe.get_config(), recipe.get_config('d2z')
  assert paper.optimizer.schedule == 'cosine' and paper.optimizer.final_lr_fraction == 0.1
  n, warmup, peak = d2z.train.num_steps, d2z.optimizer.warmup_steps, d2z.optimizer.peak_lr
  lr = optimizer.lr_values(d2z.optimizer, n, np.array([warmup, (warmup + n - 1) / 2, n - 1]))
  np.testing.assert_allclose(lr, [peak, peak / 2, 0.0], rtol=1e-5, atol=1e-12)  # the line starts one update in
  assert d2z.to_dict() == {**paper.to_dict(), 'optimizer': d2z.optimizer.to_dict()}
