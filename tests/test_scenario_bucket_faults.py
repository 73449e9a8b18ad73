"""Training and `prepare` on a bucket that struggles: a fault-injecting proxy (tests/fault_proxy.py) in front of the
real GCS server injects 503s, 429s, cut downloads and outages, with the retry window (neobert_jax/bucket.py) set
small through its one knob. Faults and an outage shorter than the window are ridden out and said ("bucket slow"),
the result bit-identical to a run without faults; an outage longer than the window stops the run promptly with one
line naming the last complete checkpoint, no traceback, and the same command resumes bit-identical."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from etils import epath

from fault_proxy import FaultProxy
from neobert_jax import paths
from neobert_jax.weights import runs
from tests.support.tiny_train import (
  assert_identical_params,
  finished_tiny_run,
  tiny_config,
  tiny_run_command,
  train_only,
)

pytestmark = [pytest.mark.server, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
WINDOW_S = 8  # the retry window for these runs: outages of 3 s are ridden out, 60 s are not


def _proxy_env(proxy: FaultProxy, tmp_path: Path) -> dict[str, str]:
  from conftest import gcs_env

  return {
    **os.environ,
    **gcs_env(proxy.url),
    'NEOBERT_BUCKET_RETRY_SECONDS': str(WINDOW_S),
    'JAX_PLATFORMS': 'cpu',
  }


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('local')
  finished_tiny_run(workdir, steps=6)
  return runs.restore_params(workdir)[1]


def test_faults_and_a_short_outage_are_ridden_out_a_long_one_stops_with_one_line_and_resumes(
  gcs, uninterrupted, tmp_path
):
  """One run through the proxy: 5% 503, 2% 429, 2% cut downloads all along; a 3 s outage when checkpoint 3 is
  written (ridden out, said once with its duration and retries); a 60 s outage when checkpoint 6 is written (the
  window is 8 s: the run stops with one line naming checkpoint 3, exit 13, no traceback). The same command then
  resumes, and ends with the parameters of an uninterrupted run without faults."""
  from neobert_jax.data import pipeline

  cfg = tiny_config(steps=6)
  local_data, _ = pipeline.open_prepared(cfg.data, int(cfg.model.max_length), int(cfg.model.vocab_size))
  root = f'{gcs}/faults-{time.time_ns()}'  # this machine's data cache is keyed by URL: never an earlier run's
  data_url, workdir = f'{root}/data', f'{root}/run'
  paths.publish_dir(local_data, epath.Path(data_url), 'manifest.json')
  proxy = FaultProxy(os.environ['STORAGE_EMULATOR_HOST'], seed=1)
  try:
    proxy.set_rates(p503=0.05, p429=0.02, pcut=0.02)
    proxy.outage_when(f'{workdir.removeprefix("gs://neobert/")}/checkpoints/3', 3)
    proxy.outage_when(f'{workdir.removeprefix("gs://neobert/")}/checkpoints/6', 60)
    start = time.monotonic()
    child = subprocess.run(
      tiny_run_command(workdir, data_url),
      cwd=REPO,
      env=_proxy_env(proxy, tmp_path),
      capture_output=True,
      text=True,
      timeout=300,
    )
    took = time.monotonic() - start
    stopped_after = time.monotonic() - proxy.outages_started[1] if len(proxy.outages_started) > 1 else None
  finally:
    proxy.end_outage()
    proxy.close()
  err = child.stderr
  print('proxy counts:', proxy.counts, f'run {took:.0f} s, stopped {stopped_after} s into the long outage')
  print('\n'.join(x for x in err.splitlines() if 'bucket' in x or x.startswith('train')))
  assert child.returncode == 13, err[-3000:]
  assert 'Traceback' not in err, err[-3000:]
  lines = [x for x in err.splitlines() if x.startswith('train: ')]
  assert len(lines) == 1 and 'storage error' in lines[0] and f'{workdir}/checkpoints/3, is kept' in lines[0], lines
  assert 'bucket slow: checkpoint 3 save took' in err, err[-3000:]
  assert proxy.counts['503'] + proxy.counts['429'] + proxy.counts['cut'] > 0 and proxy.counts['outage'] > 0
  assert stopped_after is not None and stopped_after < 3 * WINDOW_S, stopped_after  # promptly: no 4.5 min hang
  # Written in the run's local mirror (the bucket was down when it would have gone up).
  mirror = paths.cache_dir('mirror', paths.url_key(paths.resolve(workdir)))
  saved = [json.loads(x) for x in (mirror / 'checkpoint_metrics.jsonl').read_text().splitlines()]
  three = [r for r in saved if r['step'] == 3 and 'checkpoint/save_seconds' in r]
  assert three and three[0]['checkpoint/save_seconds'] >= 2.5 and three[0]['checkpoint/save_retries'] > 0, saved
  assert runs.latest_step(workdir) == 3

  cfg.data.dir = data_url
  assert train_only(cfg, workdir).final_step == 6  # the same command, the bucket back
  assert_identical_params(runs.restore_params(workdir)[1], uninterrupted)


def test_prepare_through_faults_and_a_short_outage_writes_the_same_bytes(gcs, tmp_path, monkeypatch, caplog):
  """prepare --output gs://... through the proxy (503, 429, cut downloads, a 3 s outage at the first shard): the
  objects are byte-identical to a prepare without faults, and the retries are said."""
  import gcsfs

  from conftest import gcs_env
  from tests.support import synthetic_data
  from neobert_jax.data.prepare import local

  words = ('the', 'cat', 'sat', 'on', 'mat', 'dog', 'ran')
  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), words)
  (tmp_path / 'in.txt').write_text('\n'.join(' '.join(words[(i + j) % 7] for j in range(40)) for i in range(400)))
  args = ['--input', str(tmp_path / 'in.txt'), '--tokenizer', vocab, '--workers', '0', '--no-progress']
  args += ['--shard-mb', '0.01', '--eval-fraction', '0.1']
  local.main([*args, '--output', f'{gcs}/prep/clean'])
  proxy = FaultProxy(os.environ['STORAGE_EMULATOR_HOST'], seed=2)
  try:
    proxy.set_rates(p503=0.05, p429=0.02, pcut=0.05)
    proxy.outage_when('prep/faulty/train-00001', 3)
    monkeypatch.setenv('NEOBERT_BUCKET_RETRY_SECONDS', str(WINDOW_S))
    for k, v in gcs_env(proxy.url).items():
      monkeypatch.setenv(k, v)
    gcsfs.GCSFileSystem.clear_instance_cache()  # epath's filesystem was made for the server itself
    caplog.set_level('WARNING')
    local.main([*args, '--output', f'{gcs}/prep/faulty'])
  finally:
    proxy.end_outage()
    proxy.close()
    monkeypatch.undo()
    gcsfs.GCSFileSystem.clear_instance_cache()
  print('proxy counts:', proxy.counts)
  assert proxy.outages_started and proxy.counts['503'] + proxy.counts['429'] > 0
  assert 'bucket slow' in caplog.text
  clean, faulty = epath.Path(f'{gcs}/prep/clean'), epath.Path(f'{gcs}/prep/faulty')
  names = sorted(p.name for p in clean.iterdir())
  assert names == sorted(p.name for p in faulty.iterdir()) and len(names) > 3
  for name in names:
    a, b = (clean / name).read_bytes(), (faulty / name).read_bytes()
    if name == 'manifest.json':  # the command and the time differ
      a, b = (json.loads(x) for x in (a, b))
      for m in (a, b):
        for k in ('command', 'seconds'):
          m.pop(k, None)
    assert a == b, name
