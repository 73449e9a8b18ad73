"""The GLUE grid sweep: restricted by flags, every point an ordinary run, finished points read back, not re-run."""

import json

import pytest

from neobert_jax.jobs import finetune as sweep
from neobert_jax.config.finetune import base_config


@pytest.mark.slow
def test_sweep_runs_restricted_grid_and_resumes(tmp_path):
  rows = [{'text': f'{w} item {i}', 'label': int(w == 'good')} for i in range(40) for w in ('good', 'bad')]
  (tmp_path / 'train.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  cfg = base_config('classification')
  m = cfg.model
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 32, 1, 2, 64
  cfg.data.train_file = str(tmp_path / 'train.jsonl')
  cfg.data.max_length = cfg.data.min_bucket = 8
  cfg.train.epochs, cfg.train.eval_batch_size = 1, 16
  cfg.logging.progress_bar = False
  first = sweep.run_sweep(cfg, tmp_path / 'sweep', [1e-3], [8], [1e-2])
  assert [r['reused'] for r in first['rows']] == [False]
  assert first['rows'][0]['workdir'].endswith('/lr0.001_bs8_wd0.01')
  # A finished point is read back, never re-run: fake one with a better score and check it wins untouched.
  done = tmp_path / 'sweep' / 'lr0.003_bs8_wd0.01'
  done.mkdir()
  results = json.loads((tmp_path / 'sweep' / 'lr0.001_bs8_wd0.01' / 'results.json').read_text())
  results['best']['metrics']['accuracy'] = 1.5
  (done / 'results.json').write_text(json.dumps(results))
  second = sweep.run_sweep(cfg, tmp_path / 'sweep', [1e-3, 3e-3], [8], [1e-2])
  assert [r['reused'] for r in second['rows']] == [True, True]
  assert second['best']['workdir'] == str(done) and sorted(p.name for p in done.iterdir()) == ['results.json']
  assert second['best']['best'] == max(r['best'] for r in second['rows'])
  table = sweep.format_sweep_table(second)
  assert 'best: lr' in table and table.count('\n') == 3
  assert json.loads((tmp_path / 'sweep' / 'sweep.json').read_text())['metric'] == 'accuracy'
  assert sweep.GRID['lr'] == (5e-6, 6e-6, 1e-5, 2e-5, 3e-5) and sweep.GRID['batch'] == (4, 8, 16, 32)
