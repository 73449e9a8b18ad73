#!/usr/bin/env python
"""Start N cooperating JAX processes on this machine, each with fake CPU devices.

    python launch/local.py -n 2 --devices-per-process 2 -- python -m neobert_jax.train --config=... --workdir=...

Every child gets NEOBERT_COORDINATOR / NEOBERT_NUM_PROCESSES / NEOBERT_PROCESS_ID / NEOBERT_NUM_CPU_DEVICES
and JAX_PLATFORMS=cpu, which `neobert_jax.distributed.initialize()` turns into one multi-process mesh of
n * devices-per-process devices. That is how the multi-host code paths (per-host data shards, per-process
checkpoint shards, process-0-only logging) are tested without a cluster.

Output lines are prefixed with "[pN]" (and also written to <log-dir>/process_N.log when --log-dir is set).
If a child fails, the others are expected to stop by themselves (the jax heartbeat); the launcher still
kills any child left after --grace seconds, so the launcher itself can never hang on a dead job.
Exit status: 0 if all children succeeded, else the first non-zero status seen.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def child_env(
  process_id: int,
  num_processes: int,
  devices_per_process: int,
  port: int,
  heartbeat_s: int | None = None,
  base: dict | None = None,
) -> dict:
  """Environment for one child (also used by the tests, which start children themselves)."""
  env = dict(os.environ if base is None else base)
  env.update(
    NEOBERT_COORDINATOR=f'127.0.0.1:{port}',
    NEOBERT_NUM_PROCESSES=str(num_processes),
    NEOBERT_PROCESS_ID=str(process_id),
    NEOBERT_NUM_CPU_DEVICES=str(devices_per_process),
    JAX_PLATFORMS='cpu',
    PYTHONUNBUFFERED='1',
  )
  if heartbeat_s:
    env['NEOBERT_HEARTBEAT_TIMEOUT'] = str(heartbeat_s)
    env.setdefault('NEOBERT_SHUTDOWN_TIMEOUT', str(max(2 * heartbeat_s, 30)))
  return env


def _pump(stream, prefix: str, sink, log_file) -> None:
  for line in iter(stream.readline, b''):
    text = line.decode(errors='replace')
    sink.write(prefix + text)
    sink.flush()
    if log_file:
      log_file.write(text)
      log_file.flush()
  stream.close()


def run(
  cmd: list[str],
  num_processes: int,
  devices_per_process: int,
  *,
  port: int | None = None,
  heartbeat_s: int | None = None,
  grace_s: float = 120.0,
  log_dir: str | None = None,
  cwd: str | None = None,
) -> int:
  port = port or free_port()
  procs, pumps, logs = [], [], []
  for i in range(num_processes):
    log_file = None
    if log_dir:
      os.makedirs(log_dir, exist_ok=True)
      log_file = open(os.path.join(log_dir, f'process_{i}.log'), 'w')
    logs.append(log_file)
    p = subprocess.Popen(
      cmd,
      env=child_env(i, num_processes, devices_per_process, port, heartbeat_s),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      cwd=cwd,
      start_new_session=True,
    )  # own process group: Ctrl-C here is forwarded by us
    procs.append(p)
    t = threading.Thread(target=_pump, args=(p.stdout, f'[p{i}] ', sys.stdout, log_file), daemon=True)
    t.start()
    pumps.append(t)

  first_bad, failed_at, reported = 0, None, set()
  try:
    while True:
      codes = [p.poll() for p in procs]
      for i, rc in enumerate(codes):
        if rc in (None, 0) or i in reported:
          continue
        reported.add(i)
        if failed_at is None:
          first_bad, failed_at = rc, time.monotonic()
          print(
            f'[launch] process {i} exited with status {rc}; waiting up to {grace_s:.0f}s for the others',
            file=sys.stderr,
            flush=True,
          )
        else:
          print(
            f'[launch] process {i} exited with status {rc}, {time.monotonic() - failed_at:.1f}s after '
            'the first failure',
            file=sys.stderr,
            flush=True,
          )
      if all(rc is not None for rc in codes):
        break
      if failed_at is not None and time.monotonic() - failed_at > grace_s:
        for i, p in enumerate(procs):
          if p.poll() is None:
            print(
              f'[launch] killing process {i}: still running {grace_s:.0f}s after a peer failed',
              file=sys.stderr,
              flush=True,
            )
            os.killpg(p.pid, signal.SIGKILL)
      time.sleep(0.2)
  except KeyboardInterrupt:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
    first_bad = first_bad or 130
  for p in procs:
    p.wait()
  for t in pumps:
    t.join(timeout=5)
  for f in logs:
    if f:
      f.close()
  return first_bad


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if '--' not in argv:
    print(__doc__, file=sys.stderr)
    return 2
  split = argv.index('--')
  parser = argparse.ArgumentParser(description='local multi-process JAX launcher (fake CPU devices)')
  parser.add_argument('-n', '--num-processes', type=int, default=2)
  parser.add_argument('--devices-per-process', type=int, default=1)
  parser.add_argument('--port', type=int, default=None, help='coordinator port (default: a free one)')
  parser.add_argument(
    '--heartbeat', type=int, default=None, help='seconds without heartbeat before a process counts as dead (default 60)'
  )
  parser.add_argument(
    '--grace', type=float, default=120.0, help='seconds to wait for the others after one fails, before killing them'
  )
  parser.add_argument('--log-dir', default=None)
  args = parser.parse_args(argv[:split])
  cmd = argv[split + 1 :]
  if not cmd:
    parser.error('no command after --')
  return run(
    cmd,
    args.num_processes,
    args.devices_per_process,
    port=args.port,
    heartbeat_s=args.heartbeat,
    grace_s=args.grace,
    log_dir=args.log_dir,
  )


if __name__ == '__main__':
  sys.exit(main())
