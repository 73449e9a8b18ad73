"""The acceptance command for a lent accelerator (benchmarks/accelerator.py) runs end to end at its `--smoke` size on
CPU, so it does not rot before a GPU is lent: every section is produced, the sides trained on the same batches."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_accelerator_benchmark_smoke(tmp_path):
  r = subprocess.run(
    [sys.executable, '-m', 'benchmarks.accelerator', '--out', str(tmp_path), '--smoke'],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=300,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  res = json.loads((tmp_path / 'accelerator.json').read_text())
  assert res['gpu_tests']['rc'] in (0, 5)  # on CPU every gpu test skips (5: none selected)
  sides = res['train_step'][0]['sides']
  assert 'torch-bf16-sdpa' in sides and any(k.startswith('jax-') for k in sides)
  assert all(s['tokens_per_s'] > 0 for s in sides.values())
  # the sides start from the same weights on the same batch
  losses = [s['first_loss'] for s in sides.values()]
  assert max(losses) - min(losses) < 0.05 * max(losses)
  assert res['training']['rc'] == 0, res['training']['tail']
  assert res['roofline']['step_seconds'] > 0, res['roofline']
  assert (tmp_path / 'accelerator.md').read_text().startswith('# Acceptance run')
