"""`prepare` throughput, local engine and Ray engine side by side on the same corpus.

  python -m benchmarks.prepare                       # built-in corpus, local engine with 1 and 2 workers
  python -m benchmarks.prepare --engine local ray    # + Ray with 1 and 2 nodes of 1 CPU (a cluster on 127.0.0.1)
  python -m benchmarks.prepare --input 'my/*.jsonl' --workers 1 2 4

Local rows: wall tokens/s, tokens/s per worker, CPU seconds of the main process (reading, writing) and of the
workers (tokenizing), tokens per worker-CPU-second (meaningful on a busy machine where wall-clock scaling is not).
Ray rows: a cluster started here with `ray.cluster_utils` (a head without CPUs and N nodes of 1 CPU, all on
loopback), its workers warmed up by a small build first; wall tokens/s, the driver's CPU seconds per unit and the
driver's planning time per shard (the work that does not shrink with more nodes). Then the planner alone on counts
the size of a web-scale build (2,048 units of 16M tokens, 256 MiB shards). Every run's shards are checked to be the
first run's bytes.

A script, not part of the library (nothing imports it): run it from the repository root as above, or as
`python benchmarks/prepare.py` where the package is installed.
"""

import argparse
import filecmp
import os
import resource
import tempfile
import time

import numpy as np

from neobert_jax.data import shards as shards_lib
from neobert_jax.data.prepare import corpus
from neobert_jax.data.prepare import local as prepare_lib


def _cpu(who) -> float:
  r = resource.getrusage(who)
  return r.ru_utime + r.ru_stime


def _tokens(m: dict) -> int:
  return m['splits']['train']['tokens'] + m['splits']['eval']['tokens']


def run_local(inputs, out, workers, flags) -> dict:
  self0, kids0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  m = prepare_lib.prepare_local(inputs, out, workers=workers, overwrite=True, **flags)
  wall = time.perf_counter() - t0
  # Pool workers have exited by now, so RUSAGE_CHILDREN holds their CPU time.
  return {
    'manifest': m,
    'tokens': _tokens(m),
    'wall': wall,
    'main_cpu': _cpu(resource.RUSAGE_SELF) - self0,
    'worker_cpu': _cpu(resource.RUSAGE_CHILDREN) - kids0,
  }


def run_ray(inputs, out, nodes, flags, split_mb, warmup) -> list[dict]:
  """One row per node count: a cluster on 127.0.0.1 grown node by node, this process its driver."""
  os.environ.setdefault('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', '0')  # every Ray process on loopback
  os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')  # and no usage report over the network
  import ray  # pylint: disable=g-import-not-at-top
  from ray.cluster_utils import Cluster  # pylint: disable=g-import-not-at-top
  from neobert_jax.data.prepare import ray_engine as prepare_ray  # pylint: disable=g-import-not-at-top

  cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False))
  rows = []
  try:
    ray.init(address=cluster.address, log_to_driver=False)
    for n in nodes:
      while len(cluster.worker_nodes) < n:
        cluster.add_node(num_cpus=1)
      cluster.wait_for_nodes()
      # Start every node's worker process (and its imports) before timing: a real build amortises it.
      prepare_ray.prepare_on_ray([warmup], f'{out}-warm', split_mb=0.05, overwrite=True, **flags)
      cpu0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
      m = prepare_ray.prepare_on_ray(inputs, f'{out}-{n}', split_mb=split_mb, overwrite=True, **flags)
      rows.append(
        {
          'nodes': n,
          'manifest': m,
          'tokens': _tokens(m),
          'wall': time.perf_counter() - t0,
          'driver_cpu': _cpu(resource.RUSAGE_SELF) - cpu0,
          'out': f'{out}-{n}',
        }
      )
  finally:
    ray.shutdown()
    cluster.shutdown()
  return rows


def plan_at_scale(units=2048, docs_per_unit=16384, shard_mb=256) -> tuple[float, int]:
  """Seconds per shard for the driver's planner on web-scale counts (~1000-token documents), and the shards."""
  rng = np.random.default_rng(0)
  counts = [rng.integers(3, 2000, docs_per_unit).astype(np.int32) for _ in range(units)]
  t0 = time.perf_counter()
  plan = shards_lib.plan_shards(counts, int(shard_mb * 2**20), shards_lib.ID_DTYPES['uint16'].itemsize)  # a BERT vocab
  return (time.perf_counter() - t0) / len(plan), len(plan)


def _same(a: str, b: str) -> bool:
  files = sorted(f for f in os.listdir(a) if f.endswith('.arrayrecord'))
  return files == sorted(f for f in os.listdir(b) if f.endswith('.arrayrecord')) and all(
    filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False) for f in files
  )


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--input', nargs='+', default=None, help='default: the built-in corpus')
  p.add_argument('--engine', nargs='+', choices=('local', 'ray'), default=['local'])
  p.add_argument('--workers', type=int, nargs='+', default=None, help='local engine (default 1 2; 2 with ray)')
  p.add_argument('--nodes', type=int, nargs='+', default=[1, 2], help='Ray engine: nodes of 1 CPU')
  p.add_argument('--repeat', type=int, default=1, help='the input this many times over (a bigger corpus)')
  p.add_argument('--split-mb', type=float, default=1.0, help='Ray engine: input per task')
  p.add_argument('--shard-mb', type=float, default=8.0)
  p.add_argument('--max-length', type=int, default=1024)
  p.add_argument('--tokenizer', default='bert-base-uncased')
  a = p.parse_args(argv)
  workers = a.workers or ([2] if 'ray' in a.engine else [1, 2])
  flags = dict(tokenizer=a.tokenizer, max_length=a.max_length, eval_fraction=0.01, shard_mb=a.shard_mb)
  with tempfile.TemporaryDirectory() as tmp:
    inputs = a.input or [corpus.default_corpus_jsonl()]
    if a.repeat > 1:  # the same files again under other names: more units, the same text
      inputs = [_repeat(inputs, a.repeat, tmp)]
    print(
      f'inputs: {inputs}, tokenizer {a.tokenizer}, max_length {a.max_length}, shards of {a.shard_mb} MiB, '
      f'{os.cpu_count()} CPUs'
    )
    print(f'{"engine":>14} {"Mtok":>6} {"wall s":>7} {"Mtok/s":>7} {"Mtok/s/CPU":>10}  details')
    base = None
    for w in workers if 'local' in a.engine else []:
      r = run_local(inputs, os.path.join(tmp, f'w{w}'), w, flags)
      rate = r['tokens'] / r['wall'] / 1e6
      per_cpu = r['tokens'] / (r['worker_cpu'] if w > 0 else r['main_cpu']) / 1e6
      label = f'local, {w} wkr'
      print(
        f'{label:>14} {r["tokens"] / 1e6:6.2f} {r["wall"]:7.1f} {rate:7.3f} {rate / max(w, 1):10.3f}  '
        f'main cpu {r["main_cpu"]:.1f} s, worker cpu {r["worker_cpu"]:.1f} s, {per_cpu:.3f} Mtok/worker-cpu-s',
        flush=True,
      )
      base = base or os.path.join(tmp, f'w{w}')
    if 'ray' in a.engine:
      warm = os.path.join(tmp, 'warm.jsonl')
      with open(inputs[0] if os.path.isfile(inputs[0]) else corpus.default_corpus_jsonl()) as f, open(warm, 'w') as o:
        o.writelines(line for _, line in zip(range(400), f))
      for r in run_ray(inputs, os.path.join(tmp, 'ray'), a.nodes, flags, a.split_mb, warm):
        e, rate = r['manifest']['engine'], r['tokens'] / r['wall'] / 1e6
        shards = sum(len(s['shards']) for s in r['manifest']['splits'].values())
        task_cpu = sum(n['cpu_seconds'] for n in e['nodes'].values())
        label = f'ray, {r["nodes"]} node'
        print(
          f'{label:>14} {r["tokens"] / 1e6:6.2f} {r["wall"]:7.1f} {rate:7.3f} '
          f'{rate / r["nodes"]:10.3f}  task cpu {task_cpu:.1f} s, {r["tokens"] / task_cpu / 1e6:.3f} Mtok/task-cpu-s, '
          f'{e["units"]} units, {shards} shards, driver cpu '
          f'{r["driver_cpu"] / e["units"] * 1e3:.1f} ms/unit, planning {e["plan_seconds_per_shard"] * 1e6:.0f} '
          f'us/shard',
          flush=True,
        )
        base = base or r['out']
        print(f'{"":>14} shards identical to {os.path.basename(base)}: {_same(base, r["out"])}')
      per_shard, n = plan_at_scale()
      print(
        f'planner alone at web scale: {n} shards of 256 MiB from 2048 units x 16384 documents: '
        f'{per_shard * 1e3:.2f} ms/shard'
      )
    for w in workers[1:] if 'local' in a.engine else []:
      print(
        f'local {w} workers: shards identical to {os.path.basename(base)}: {_same(base, os.path.join(tmp, f"w{w}"))}'
      )


def _repeat(inputs, times, tmp) -> str:
  from neobert_jax.data.prepare import sources  # pylint: disable=g-import-not-at-top

  folder = os.path.join(tmp, 'repeated')
  os.makedirs(folder)
  for k in range(times):
    for i, f in enumerate(sources.expand_inputs(inputs)):
      os.symlink(os.path.abspath(f), os.path.join(folder, f'{k:03d}-{i:04d}-{os.path.basename(f)}'))
  return folder


if __name__ == '__main__':
  main()
