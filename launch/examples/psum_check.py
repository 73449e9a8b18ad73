"""Smallest multi-process sanity check: every process contributes its id, all must agree on the sum.

    python launch/local.py -n 2 --devices-per-process 2 -- python launch/examples/psum_check.py [--steps N]

Prints one 'PSUM step=<i> value=<v> processes=<n> devices=<d>' line per step. With --die-at K, process 1
hard-exits (or raises, --die-how raise) at step K (used to test that the survivors stop on their own).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from neobert_jax import distributed  # noqa: E402  (must run before jax touches a backend)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--steps', type=int, default=3)
  ap.add_argument('--sleep', type=float, default=0.0)
  ap.add_argument('--die-at', type=int, default=-1)
  ap.add_argument('--die-how', choices=('exit', 'raise'), default='exit')
  args = ap.parse_args()
  info = distributed.initialize()

  import jax
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  mesh = jax.make_mesh((jax.device_count(),), ('data',), axis_types=(AxisType.Auto,))
  local = np.full((jax.local_device_count(), 1), info.process_id + 1, np.float32)
  x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), local)
  total = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a.sum(), 'data'), mesh=mesh, in_specs=P('data'), out_specs=P()))
  for step in range(args.steps):
    if step == args.die_at and info.process_id == 1:
      print('process 1 dying now', flush=True)
      if args.die_how == 'raise':
        raise RuntimeError('simulated failure in process 1')
      os._exit(17)
    print(
      f'PSUM step={step} value={float(total(x))} processes={jax.process_count()} devices={jax.device_count()}',
      flush=True,
    )
    time.sleep(args.sleep)
  if distributed.is_primary():
    print('PRIMARY done', flush=True)


if __name__ == '__main__':
  main()
