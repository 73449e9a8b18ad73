"""`prepare --engine=ray`: the local engine's shards, made by the tasks of a Ray cluster.

Pass 1: one task per unit of input (splits.py) tokenizes as documents.py does and keeps its records in the work
area (ray_tasks.Ledger); the driver plans the shards over the token counts (rollover.py); pass 2: one task per shard
writes it. The manifest differs from the local one only in its run fields; a re-run of a killed build resumes.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Any

from neobert_jax import errors, paths
from neobert_jax import lease as lease_lib
from neobert_jax.data import rollover, shards
from neobert_jax.data.prepare import documents
from neobert_jax.data.prepare import hf
from neobert_jax.data.prepare import publish
from neobert_jax.data.prepare import ray_tasks
from neobert_jax.data.prepare import sources
from neobert_jax.data.prepare import splits
from neobert_jax.data import tokenizer as tokenizer_lib

RETRIES = 5  # per task, for a lost node, a killed worker or a storage hiccup


def connect(address: str):
  """(ray, whether this call connected): checked before any work, an unreachable cluster is one line."""
  try:
    import ray  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.ConfigError("--engine=ray needs Ray: pip install 'neobert-jax[ray]'") from None
  if ray.is_initialized():
    return ray, False
  fix = (
    'start one (`ray start --head` on the head node, `ray start --address=HEAD:6379` on the others) and pass '
    'the address `ray status` shows, or --ray-address=auto on a node of the cluster'
  )
  if address != 'auto':
    host, _, port = address.rpartition(':')
    try:  # Ray itself waits a minute or more on an address where nothing listens
      socket.create_connection((host.strip('[]'), int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
      reason = getattr(e, 'strerror', None) or errors.one_line(e)
      raise errors.DistributedError(
        f'--ray-address={address}: no Ray cluster answers there ({reason}); {fix}'
      ) from None
  try:
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
  except Exception as e:  # noqa: BLE001 - ConnectionError, or Ray's own timeouts
    raise errors.DistributedError(
      f'--ray-address={address}: cannot join the Ray cluster ({errors.one_line(e)}); {fix}'
    ) from None
  return ray, True


def prepare_on_ray(
  inputs,
  output_dir: str,
  options: documents.BuildOptions | None = None,
  *,
  ray_address: str = 'auto',
  split_mb: float = 64.0,
  **fields: Any,
) -> dict:
  """Tokenizes `inputs` into `output_dir` on the Ray cluster at `ray_address`, about `split_mb` per task; returns
  the manifest. `options`, or its fields as keywords (documents.BuildOptions), say what to build."""
  o = documents.BuildOptions.of(options, fields)
  named = [item for item in inputs if hf.is_input(item)]
  if named:  # the plan cuts files by size; a dataset has none to cut
    raise errors.ConfigError(
      f'--input {named[0]}: --engine=ray reads files; prepare a Hugging Face dataset with --engine=local'
    )
  with lease_lib.acquire(output_dir, '--output'):  # one build per output, before anything there is read
    ray, connected = connect(ray_address)
    try:
      return _build(ray, inputs, output_dir, ray_address, o, split_bytes=max(1, int(split_mb * 2**20)))
    finally:
      if connected:
        ray.shutdown()


def _build(ray, inputs, output_dir, address, o: documents.BuildOptions, split_bytes: int) -> dict:
  start, files = time.time(), sources.expand_inputs(inputs)
  tok = tokenizer_lib.load_tokenizer(o.tokenizer)
  out = publish.open_output(output_dir, o.overwrite)
  units, sizes = splits.plan(files, split_bytes, o.text_mode)
  ledger, width = ray_tasks.Ledger(out), shards.id_dtype_name(tok.vocab_size)
  identity = {
    'format': shards.FORMAT,
    'id_dtype': width,
    'tokenizer': tok.identity(),
    'shard_bytes': o.shard_bytes,
    **o.record_fields(),
    'units': [[p, sizes[p], s and [s.start, s.end, s.seek, s.row]] for p, s in units],
  }
  done = ledger.finished_units() if ledger.start(identity) else {}
  with open(tok.path, 'rb') as f:  # once into the object store, not into every task's arguments
    shipped = ray.put((o.tokenizer, os.path.basename(tok.path), f.read()))
  results = _pass1(ray, units, o, ledger, shipped, done)
  counts = documents.Counts(echo=False)
  for i in range(len(units)):
    counts.add(results[i])
    for issue in results[i]['issues'] if i not in done else ():
      print(f'warning: {issue}; replaced with U+FFFD', file=sys.stderr)

  t0, itemsize = time.perf_counter(), shards.ID_DTYPES[width].itemsize
  doc_tokens = {s: [results[i]['doc_tokens'][s] for i in range(len(units))] for s in shards.SPLITS}
  plans = {s: rollover.plan_shards(doc_tokens[s], o.shard_bytes, itemsize) for s in shards.SPLITS}
  plan_seconds = time.perf_counter() - t0
  (out / shards.MANIFEST).unlink(missing_ok=True)  # only with --overwrite (open_output): now it reads unfinished
  shard_results, resumed_shards = _pass2(ray, plans, o, width, ledger, out)

  call = f'prepare_ray.prepare({list(inputs)!r}, {output_dir!r}, ...)'
  manifest = documents.manifest(tok, o, _splits(plans, shard_results), files, counts, call)
  manifest.update(
    seconds=round(time.time() - start, 3),
    engine={
      'kind': 'ray',
      'address': address,
      'units': len(units),
      'resumed_units': len(done),
      'resumed_shards': resumed_shards,
      'plan_seconds_per_shard': plan_seconds / max(1, len(shard_results)),
      'nodes': _per_node(results, shard_results),
    },
  )
  publish.commit(out, shards.Manifest.of(manifest, output_dir))
  ledger.remove()
  return manifest


def _pass1(ray, units, o, ledger, shipped, done) -> dict:
  """Every unit's counts by index (the ledger's for finished units); bad input raises the first error in input
  order, as the local engine meets it."""
  results = {i: {**meta, 'doc_tokens': doc_tokens} for i, (meta, doc_tokens) in done.items()}
  todo = [(i, (i, p, s, o, ledger, shipped)) for i, (p, s) in enumerate(units) if i not in done]
  _run(ray, ray_tasks.tokenize_unit, todo, results, o.progress, 'unit', stop_on_error=True)
  failed = sorted(i for i, r in results.items() if 'error' in r)
  if failed:
    ledger.remove()
    error = results[failed[0]]['error']
    raise (errors.StorageError if error['storage'] else errors.DataError)(error['message'])
  return results


def _pass2(ray, plans: dict, o, width: str, ledger, out: paths.Path) -> tuple[dict, int]:
  """Every shard of the plan in place, by file name, and how many a resumed build kept."""
  finished, results, todo = ledger.finished_shards(), {}, []
  for split, plan in plans.items():
    for k, pieces in enumerate(plan):
      name = shards.shard_name(split, k)
      old = finished.get(name)
      if old and old['pieces'] == [list(p) for p in pieces] and _in_place(out / name, old['entry']):
        results[name] = old
      else:
        todo.append((name, (split, k, pieces, o.shard_bytes, width, ledger, os.fspath(out))))
  kept = len(results)
  _run(ray, ray_tasks.assemble_shard, todo, results, o.progress, 'shard')
  return results, kept


def _in_place(path: paths.Path, entry: dict) -> bool:
  return path.exists() and path.stat().length == entry['bytes']


def _run(ray, fn, todo: list, results: dict, progress: bool, unit: str, stop_on_error: bool = False) -> None:
  """results[key] = fn(*args), a Ray task, for each (key, args) of `todo`, a bounded number in flight; with
  stop_on_error no task starts after an input error (those started finish: one may hold an earlier error)."""
  task = ray.remote(fn).options(num_cpus=1, max_retries=RETRIES, retry_exceptions=True, scheduling_strategy='SPREAD')
  window = max(2, 2 * int(ray.cluster_resources().get('CPU', 1)))
  pending, queue, stopped, tokens, t0 = {}, iter(todo), False, 0, time.perf_counter()
  total, desc = len(results) + len(todo), f'prepare (ray, {unit}s)'
  with documents.progress_bar(progress, total=total, initial=len(results), unit=unit, desc=desc) as bar:
    while True:
      while not stopped and len(pending) < window and (nxt := next(queue, None)) is not None:
        pending[task.remote(*nxt[1])] = nxt[0]
      if not pending:
        return
      ready, _ = ray.wait(list(pending), num_returns=1)
      key = pending.pop(ready[0])
      try:
        results[key] = result = ray.get(ready[0])
      except ray.exceptions.RayError as e:
        raise errors.DistributedError(
          f'a task failed {RETRIES + 1} times ({errors.one_line(e)[:300]}); the finished work is kept: run the '
          'same command again to resume'
        ) from None
      stopped = stopped or (stop_on_error and 'error' in result)
      tokens += result.get('tokens') or result.get('entry', {}).get('tokens', 0)
      bar.update(1)
      bar.set_postfix_str(f'{tokens / max(time.perf_counter() - t0, 1e-9) / 1e6:.2f}M tokens/s', refresh=False)


def _splits(plans: dict, shard_results: dict) -> dict:
  out = {}
  for split, plan in plans.items():
    entries = [shard_results[shards.shard_name(split, k)]['entry'] for k in range(len(plan))]
    out[split] = {
      'shards': entries,
      'documents': sum(end - first for p in plan for _, first, end in p),
      'records': sum(e['records'] for e in entries),
      'tokens': sum(e['tokens'] for e in entries),
    }
  return out


def _per_node(units: dict, shard_results: dict) -> dict:
  nodes = {}
  for r in list(units.values()) + list(shard_results.values()):
    n = nodes.setdefault(r['node'], {'ip': r['ip'], 'units': 0, 'tokens': 0, 'cpu_seconds': 0.0, 'shards': 0})
    if 'entry' in r:
      n['shards'] += 1
    else:
      n['units'], n['tokens'] = n['units'] + 1, n['tokens'] + r['tokens']
      n['cpu_seconds'] = round(n['cpu_seconds'] + r['cpu_seconds'], 3)
  return nodes
