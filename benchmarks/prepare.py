"""`prepare` throughput: tokens/s per worker and scaling from 1 to 2 workers.

  python -m benchmarks.prepare    # built-in corpus, 1 and 2 workers
  python -m benchmarks.prepare --input 'my/*.jsonl' --workers 1 2 4

Prints, per worker count: wall tokens/s, tokens/s per worker, the CPU seconds
spent by the main process (reading, writing) and by the workers (tokenizing),
and tokens per worker-CPU-second, which stays meaningful on a busy machine
where wall-clock scaling does not. Output shards are checked to be identical.

A script, not part of the library (nothing imports it): run it from the repository root as above, or as
`python benchmarks/prepare.py` where the package is installed.
"""

import argparse
import filecmp
import os
import resource
import tempfile
import time

from neobert_jax.data import corpus
from neobert_jax.data import prepare as prepare_lib


def _cpu(who) -> float:
  r = resource.getrusage(who)
  return r.ru_utime + r.ru_stime


def run(inputs, out, workers, max_length, tokenizer) -> dict:
  self0, kids0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  m = prepare_lib.prepare(inputs, out, tokenizer=tokenizer, max_length=max_length,
                          workers=workers, eval_fraction=0.01, overwrite=True)
  wall = time.perf_counter() - t0
  # Pool workers have exited by now, so RUSAGE_CHILDREN holds their CPU time.
  main_cpu = _cpu(resource.RUSAGE_SELF) - self0
  worker_cpu = _cpu(resource.RUSAGE_CHILDREN) - kids0
  tokens = m['splits']['train']['tokens'] + m['splits']['eval']['tokens']
  return {'manifest': m, 'tokens': tokens, 'wall': wall, 'main_cpu': main_cpu,
          'worker_cpu': worker_cpu}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--input', nargs='+', default=None, help='default: the built-in corpus')
  p.add_argument('--workers', type=int, nargs='+', default=[1, 2])
  p.add_argument('--max-length', type=int, default=1024)
  p.add_argument('--tokenizer', default='bert-base-uncased')
  a = p.parse_args(argv)
  inputs = a.input or [corpus.default_corpus_jsonl()]
  print(f'inputs: {inputs}, tokenizer {a.tokenizer}, max_length {a.max_length}, '
        f'{os.cpu_count()} CPUs')
  print(f'{"workers":>7} {"Mtok":>6} {"wall s":>7} {"Mtok/s":>7} {"Mtok/s/worker":>13} '
        f'{"main cpu s":>10} {"worker cpu s":>12} {"Mtok/worker-cpu-s":>17}')
  with tempfile.TemporaryDirectory() as tmp:
    base = None
    for w in a.workers:
      out = os.path.join(tmp, f'w{w}')
      r = run(inputs, out, w, a.max_length, a.tokenizer)
      per_worker_cpu = r['worker_cpu'] if w > 0 else r['main_cpu']
      rate = r['tokens'] / r['wall'] / 1e6
      print(f'{w:>7} {r["tokens"] / 1e6:6.2f} {r["wall"]:7.1f} {rate:7.3f} '
            f'{rate / max(w, 1):13.3f} {r["main_cpu"]:10.1f} '
            f'{r["worker_cpu"]:12.1f} {r["tokens"] / per_worker_cpu / 1e6:17.3f}', flush=True)
      shard_files = sorted(f for f in os.listdir(out) if f.endswith('.arrayrecord'))
      if base is None:
        base = (out, shard_files)
      else:
        same = base[1] == shard_files and all(
            filecmp.cmp(os.path.join(base[0], f), os.path.join(out, f), shallow=False)
            for f in shard_files)
        print(f'        shards identical to {os.path.basename(base[0])}: {same}')


if __name__ == '__main__':
  main()
