"""The main job's steps with and without glibc's huge-page malloc (neobert_jax/host_memory.py), side by side.

python -m benchmarks.host_memory [--steps 300] [--repeats 2] [--out runs/host_memory]

Runs the README's main job (configs/tiny_cpu.py, no evaluation, no probe, no export) for --steps steps as a
child process, alternating NEOBERT_JAX_HUGE_PAGES=0 (the process as started) with the default (re-executed with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 where that helps), --repeats times each. Prints, per arm, the best wall
time, user and system CPU seconds and minor page faults (getrusage of the finished child), and the ratios. CPU
seconds and faults barely move when other work shares the machine; wall time does, so compare the CPU columns
on a busy machine.

A script, not part of the library: run it from the repository root.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ARMS = {'as started': '0', 'huge pages': '1'}


def _one(steps: int, workdir: Path, switch: str) -> dict[str, float]:
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, '-m', 'neobert_jax.train', '--config=configs/tiny_cpu.py', f'--workdir={workdir}']
  cmd += [f'--config.train.num_steps={steps}', '--config.eval.every_steps=0', '--config.eval.probe_task=']
  cmd += ['--config.checkpoint.every_steps=100000', '--config.optimizer.warmup_steps=10']
  cmd += ['--config.optimizer.warmup_fraction=0']
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}
  env['NEOBERT_JAX_HUGE_PAGES'] = switch
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  return {
    'wall': wall,
    'user': after.ru_utime - before.ru_utime,
    'sys': after.ru_stime - before.ru_stime,
    'faults': after.ru_minflt - before.ru_minflt,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--out', default='runs/host_memory')
  args = parser.parse_args()
  best: dict[str, dict[str, float]] = {}
  for r in range(args.repeats):
    for name, switch in ARMS.items():
      got = _one(args.steps, Path(args.out) / 'run', switch)
      print(f'repeat {r} {name}: ' + ', '.join(f'{k} {v:,.1f}' for k, v in got.items()), flush=True)
      prev = best.get(name)
      best[name] = got if prev is None or got['user'] + got['sys'] < prev['user'] + prev['sys'] else prev
  base, huge = best['as started'], best['huge pages']
  print(f'\n{args.steps} steps of configs/tiny_cpu.py, best of {args.repeats} (by CPU seconds):')
  print('| arm | wall s | user s | sys s | CPU s | minor faults |\n|---|---|---|---|---|---|')
  for name, m in best.items():
    print(
      f'| {name} | {m["wall"]:.1f} | {m["user"]:.1f} | {m["sys"]:.1f} | {m["user"] + m["sys"]:.1f} | {m["faults"]:,.0f} |'
    )
  cpu = (huge['user'] + huge['sys']) / (base['user'] + base['sys'])
  print(
    f'huge pages / as started: CPU {cpu:.2f}x, wall {huge["wall"] / base["wall"]:.2f}x, '
    f'faults {huge["faults"] / max(base["faults"], 1):.3f}x'
  )


if __name__ == '__main__':
  main()
