"""Per-host data on a pod, simulated: n processes as hosts read one prepared corpus from a GCS server.

  python -m benchmarks.pod_data                       # 2, 4 and 8 hosts, two corpus sizes, local GCS emulator
  python -m benchmarks.pod_data --hosts 2 4 --steps 40

The corpus (synthetic documents, the built-in tokenizer's size) is prepared twice, at `--docs` and 4 x `--docs`
documents, into small shards, and uploaded to a gcp-storage-emulator on 127.0.0.1. For each host count n, n
processes start at once, each with a cache and a working directory of its own (hosts share no disk), each builds
its train iterator as process p of n (data.virtual_shards 8) and takes `--steps` batches. Each prints, per host:
bytes downloaded, peak bytes on its disk, seconds to its first batch, and tokens/s of its own rows. The table
also gives the share of the corpus each host fetched: about 1/n (plus the file each share's edge cuts), and not
growing with the corpus for the time to the first batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HOST = r"""
import json, os, sys, time
from neobert_jax.config import data as config_lib
from neobert_jax.data import pipeline
url, p, n, batch, steps, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
cfg = config_lib.default_data_config()
cfg.dir, cfg.virtual_shards, cfg.block_docs, cfg.shuffle_window = url, 8, 256, 2
t0 = time.perf_counter()
it = pipeline.make_train_iterator(cfg, batch // n, seq, seed=0, process_index=p, process_count=n)
next(it)
first = time.perf_counter() - t0
t1 = time.perf_counter()
for _ in range(steps):
  next(it)
took = time.perf_counter() - t1
(s,) = [vars(store.stats) for store in it.stores.values()]
print(json.dumps({'host': p, 'first_batch_s': first, 'tokens_per_s': steps * batch // n * seq / took, **s}))
it.close()
"""


def _prepare(directory: str, docs: int, copies: int) -> dict:
  from tests.support import synthetic_data  # pylint: disable=g-import-not-at-top

  documents = [d for seed in range(copies) for d in synthetic_data.synthetic_documents(docs, seed=seed, max_len=600)]
  return synthetic_data.write_prepared(directory, documents, max_length=512, shard_bytes=1 << 18)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--hosts', type=int, nargs='+', default=[2, 4, 8], help='host counts (processes) to run')
  p.add_argument('--docs', type=int, default=8_000, help='documents of the smaller corpus (the larger has 4x)')
  p.add_argument('--steps', type=int, default=40, help='batches each host takes after its first')
  p.add_argument('--batch', type=int, default=64, help='global batch (rows)')
  p.add_argument('--seq-len', type=int, default=512, help='row length')
  a = p.parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from neobert_jax import paths  # pylint: disable=g-import-not-at-top
  from neobert_jax.data.prepare import publish  # pylint: disable=g-import-not-at-top
  from neobert_jax.data import shards  # pylint: disable=g-import-not-at-top
  from tests.conftest import gcs_env, start_gcs_emulator  # pylint: disable=g-import-not-at-top

  emulator, endpoint = start_gcs_emulator()
  env = {**os.environ, **gcs_env(endpoint), 'JAX_PLATFORMS': 'cpu'}
  os.environ.update(gcs_env(endpoint))
  try:
    with tempfile.TemporaryDirectory() as tmp:
      print(
        f'{"corpus":>14} {"hosts":>5} {"host":>4} {"MiB fetched":>11} {"share":>6} {"peak disk MiB":>13} '
        f'{"first batch s":>13} {"tokens/s":>9}'
      )
      for copies in (1, 4):
        docs = a.docs * copies
        local = os.path.join(tmp, f'corpus-{docs}')
        m = _prepare(local, a.docs, copies)
        total = sum(s['bytes'] for s in m['splits']['train']['shards'])
        url = f'gs://neobert/pod-bench/{docs}-{int(time.time())}'
        publish.upload(local, paths.Path(url), shards.Manifest.of(m))
        name = f'{total / 2**20:.0f} MiB/{len(m["splits"]["train"]["shards"])}f'
        for n in a.hosts:
          procs = []
          for host in range(n):
            home = os.path.join(tmp, f'h{n}-{docs}-{host}')
            os.makedirs(home)
            args = [url, str(host), str(n), str(a.batch), str(a.steps), str(a.seq_len)]
            procs.append(
              subprocess.Popen(
                [sys.executable, '-c', HOST, *args],
                cwd=home,
                env={**env, 'NEOBERT_JAX_CACHE': os.path.join(home, 'cache'), 'PYTHONPATH': os.getcwd()},
                stdout=subprocess.PIPE,
                text=True,
              )
            )
          for proc in procs:
            out, _ = proc.communicate()
            r = json.loads(out.strip().splitlines()[-1])
            print(
              f'{name:>14} {n:5d} {r["host"]:4d} {r["bytes_downloaded"] / 2**20:11.1f} '
              f'{r["bytes_downloaded"] / total:6.2f} {r["peak_disk_bytes"] / 2**20:13.1f} '
              f'{r["first_batch_s"]:13.2f} {r["tokens_per_s"]:9.0f}',
              flush=True,
            )
  finally:
    emulator.terminate()


if __name__ == '__main__':
  main()
