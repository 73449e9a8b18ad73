"""A training run on a bucket that fails: how the retry window (neobert_jax/bucket.py) carries it, and what it says.

  python -m benchmarks.bucket_outage                        # a 90 s outage while checkpoint 3 is written
  python -m benchmarks.bucket_outage --outage 400 --window 60

The tiny run (6 steps, checkpoints at 3 and 6) trains in a child process on a gcp-storage-emulator on 127.0.0.1,
through the fault proxy of the tests (tests/fault_proxy.py: 5% 503, 2% 429, 2% cut downloads, and an outage of
--outage seconds from the first request of checkpoint --at). It prints the child's exit status and duration, the
proxy's counts, the child's "bucket slow" and error lines, and whether the run's parameters are bit-identical to
the same run on local disk without faults. With the window left at its default (300 s) a 90 s outage is ridden
out; an outage longer than --window stops the run with one line naming the last complete checkpoint.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--outage', type=float, default=90.0, help='seconds of outage (every request answered 503)')
  p.add_argument('--at', type=int, default=3, help='the outage starts with the first request of this checkpoint')
  p.add_argument('--window', type=float, default=0.0, help='NEOBERT_BUCKET_RETRY_SECONDS (0: the default)')
  p.add_argument('--seed', type=int, default=3, help="the proxy's fault draws")
  a = p.parse_args()
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sys.path.insert(0, repo)
  from tests.conftest import gcs_env, start_gcs_emulator  # pylint: disable=g-import-not-at-top
  from tests.fault_proxy import FaultProxy  # pylint: disable=g-import-not-at-top

  emulator, endpoint = start_gcs_emulator()
  os.environ.update(gcs_env(endpoint))
  from etils import epath  # pylint: disable=g-import-not-at-top

  from neobert_jax import paths  # pylint: disable=g-import-not-at-top
  from neobert_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  from tests.support import tiny_train  # pylint: disable=g-import-not-at-top
  from tests.support.tiny_train import assert_identical_params, tiny_config  # pylint: disable=g-import-not-at-top
  from neobert_jax.weights import runs  # pylint: disable=g-import-not-at-top

  proxy = None
  try:
    cfg = tiny_config(steps=6)
    data, _ = pipeline.open_prepared(cfg.data, int(cfg.model.max_length), int(cfg.model.vocab_size))
    root = f'gs://neobert/outage-{time.time_ns()}'  # this machine's data cache is keyed by URL: a fresh one
    paths.publish_dir(data, epath.Path(f'{root}/data'), 'manifest.json')
    reference = os.path.join(tempfile.mkdtemp(), 'run')
    tiny_train.train_only(tiny_config(steps=6), reference)
    proxy = FaultProxy(endpoint, seed=a.seed)
    proxy.set_rates(p503=0.05, p429=0.02, pcut=0.02)
    proxy.outage_when(f'{root.removeprefix("gs://neobert/")}/run/checkpoints/{a.at}/', a.outage)
    env = {**os.environ, **gcs_env(proxy.url), 'JAX_PLATFORMS': 'cpu'}
    env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
    if a.window:
      env['NEOBERT_BUCKET_RETRY_SECONDS'] = str(a.window)
    start = time.monotonic()
    child = subprocess.run(
      tiny_train.tiny_run_command(f'{root}/run', f'{root}/data'),
      cwd=repo,
      env=env,
      capture_output=True,
      text=True,
    )
    took = time.monotonic() - start
    began = proxy.outages_started[0] - start if proxy.outages_started else None
    print(f'exit {child.returncode} after {took:.0f} s (outage began at {began and round(began)} s); {proxy.counts}')
    for line in child.stderr.splitlines():
      if 'bucket slow' in line or line.startswith('train:') or 'Traceback' in line:
        print('  ' + line)
    if child.returncode == 0:
      assert_identical_params(runs.restore_params(f'{root}/run')[1], runs.restore_params(reference)[1])
      print('parameters bit-identical to the run on local disk without faults')
  finally:
    if proxy is not None:
      proxy.close()
    emulator.terminate()


if __name__ == '__main__':
  main()
