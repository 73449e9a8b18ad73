"""`prepare --engine=ray`: the local engine's shards, made by the tasks of a Ray cluster in two passes (docs/data.md,
"How it works, and why two passes", and "Resume after a failure"). The work area OUTPUT/.prepare-work (`Ledger`):
build.json (the build's identity), units/NNNNNN.SPLIT.npz (records), units/NNNNNN.done.npz (counts, written last:
the unit's entry), shards/NAME.json (a shard in place, with its plan), each written whole. A task's bad input comes
back as a value ({'error': ...}), never retried; any exception is a machine's fault and Ray retries it."""

import concurrent.futures
import functools
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import sys
import time
from typing import Any

import numpy as np

from neobert_jax import bucket, errors, paths
from neobert_jax import lease as lease_lib
from neobert_jax.data import shards
from neobert_jax.data.prepare import documents
from neobert_jax.data.prepare import hf
from neobert_jax.data.prepare import publish
from neobert_jax.data.prepare import sources
from neobert_jax.data.prepare import splits
from neobert_jax.data import tokenizer as tokenizer_lib

RETRIES = 5  # per task, for a lost node, a killed worker or a storage hiccup
WORK = '.prepare-work'
_PARALLEL = 16  # object-store reads of a resumed build's entries at once (each is a small request)


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
      why = getattr(e, 'strerror', None) or errors.one_line(e)
      raise errors.DistributedError(f'--ray-address={address}: no Ray cluster answers there ({why}); {fix}') from None
  try:
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
  except Exception as e:  # noqa: BLE001 - ConnectionError, or Ray's own timeouts
    why = errors.one_line(e)
    raise errors.DistributedError(f'--ray-address={address}: cannot join the Ray cluster ({why}); {fix}') from None
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
  """Tokenizes `inputs` into `output_dir` on the Ray cluster at `ray_address`, `split_mb` per task; the manifest."""
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
  ledger, width = Ledger(out), shards.id_dtype_name(tok.vocab_size)
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
  plans = {s: shards.plan_shards(doc_tokens[s], o.shard_bytes, itemsize) for s in shards.SPLITS}
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
  _run(ray, tokenize_unit, todo, results, o.progress, 'unit', stop_on_error=True)
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
      planned = old and old['pieces'] == [list(p) for p in pieces]
      if planned and (out / name).exists() and (out / name).stat().length == old['entry']['bytes']:  # in place
        results[name] = old
      else:
        todo.append((name, (split, k, pieces, o.shard_bytes, width, ledger, os.fspath(out))))
  kept = len(results)
  _run(ray, assemble_shard, todo, results, o.progress, 'shard')
  return results, kept


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


def _npz(arrays: dict) -> bytes:
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


def _load_npz(path: paths.Path) -> dict[str, np.ndarray]:
  with np.load(io.BytesIO(path.read_bytes())) as z:
    return {k: z[k] for k in z.files}


class Ledger:
  """Sent to every task: just where the area is."""

  def __init__(self, output: paths.Path | str):
    self.root = f'{os.fspath(output).rstrip("/")}/{WORK}'

  def _path(self, *parts: str) -> paths.Path:
    return paths.Path('/'.join((self.root,) + parts))

  def start(self, identity: dict) -> bool:
    """Opens the area for a build; True when it resumes an earlier run of the same build."""
    marker = self._path('build.json')
    if marker.exists():
      if json.loads(marker.read_text()) == identity:
        return True
      print(f'prepare: {self.root} holds an unfinished build of other inputs or flags; starting afresh')
      self.remove()
    for sub in ('units', 'shards'):
      self._path(sub).mkdir(parents=True, exist_ok=True)
    paths.write_bytes(marker, json.dumps(identity, sort_keys=True).encode())
    return False

  def check_visible(self) -> None:
    """In a task: this node sees the area (a local --output must be a directory every node mounts)."""
    if not self._path('build.json').exists():
      raise errors.StorageError(
        f'{self.root} cannot be seen from this node: on a cluster, --output must be a bucket (gs://...) or a '
        'directory every node mounts at the same path'
      )

  def write_unit(self, index: int, records: dict, counts: dict, doc_tokens: dict[str, np.ndarray]) -> None:
    for split, arrays in records.items():
      paths.write_bytes(self._path(f'units/{index:06d}.{split}.npz'), _npz(arrays))
    meta = np.frombuffer(json.dumps(counts, sort_keys=True).encode(), np.uint8)
    paths.write_bytes(self._path(f'units/{index:06d}.done.npz'), _npz({'meta': meta, **doc_tokens}))

  def read_records(self, index: int, split: str) -> dict[str, np.ndarray]:
    return _load_npz(self._path(f'units/{index:06d}.{split}.npz'))

  def finished_units(self) -> dict[int, tuple[dict, dict[str, np.ndarray]]]:
    """index -> (counts, per-document token counts per split) of every unit with an entry."""

    def read(path):
      doc_tokens = _load_npz(path)
      return int(path.name.split('.')[0]), (json.loads(doc_tokens.pop('meta').tobytes()), doc_tokens)

    return self._read_all('units', '.done.npz', read)

  def write_shard(self, name: str, entry: dict) -> None:
    paths.write_bytes(self._path(f'shards/{name}.json'), json.dumps(entry, sort_keys=True).encode())

  def finished_shards(self) -> dict[str, dict]:
    return self._read_all('shards', '.json', lambda p: (p.name[: -len('.json')], json.loads(p.read_text())))

  def _read_all(self, sub: str, suffix: str, read) -> dict:
    folder = self._path(sub)  # on a bucket a folder exists only while it holds an object
    found = [p for p in folder.iterdir() if p.name.endswith(suffix)] if folder.exists() else []
    with concurrent.futures.ThreadPoolExecutor(_PARALLEL) as pool:
      return dict(pool.map(read, found))

  def remove(self) -> None:
    root = self._path()
    if not paths.is_url(self.root):
      shutil.rmtree(root, ignore_errors=True)
    elif root.exists():
      with concurrent.futures.ThreadPoolExecutor(_PARALLEL) as pool:
        list(pool.map(lambda p: p.unlink(missing_ok=True), list(paths.walk(root))))


def node() -> dict:
  import ray  # pylint: disable=g-import-not-at-top

  return {'node': ray.get_runtime_context().get_node_id(), 'ip': ray.util.get_node_ip_address()}


@functools.cache  # once per worker process
def _tokenizer(spec: str, name: str, blob: bytes):
  """The driver's tokenizer file, shipped as bytes (a node need not have it, nor the driver's paths)."""
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'  # one task = one CPU, as the local engine's workers
  path = paths.cache_dir('prepare-tokenizers', hashlib.sha256(blob).hexdigest()[:16]) / name
  if not path.exists():
    paths.write_bytes(path, blob)
  return tokenizer_lib.load_tokenizer(str(path))


def _records(chunks: list[list[np.ndarray]], dtype: np.dtype) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """Documents' records as flat arrays (ids `dtype` wide, record lengths, records per document), and their tokens."""
  flat = [c for doc in chunks for c in doc]
  lengths = np.array([c.size for c in flat], np.int32)
  per_doc = np.array([len(doc) for doc in chunks], np.int32)
  ids = shards.narrow(np.concatenate(flat), dtype) if flat else np.zeros(0, dtype)
  doc_tokens = np.add.reduceat(lengths, np.cumsum(per_doc) - per_doc) if flat else np.zeros(0, np.int32)
  return {'ids': ids, 'lengths': lengths, 'per_doc': per_doc}, doc_tokens.astype(np.int32)


def tokenize_unit(index: int, path: str, span, o: documents.BuildOptions, ledger: Ledger, tokenizer: tuple) -> dict:
  """Pass 1 for one unit: {'index', 'node', 'ip', counts..., 'doc_tokens': {split: array}} or {'error': ...}."""
  bucket.install()  # a worker process reaches the bucket with the driver's retry budget (it resolves no path)
  out, cpu = {'index': index, **node()}, time.process_time()
  try:
    ledger.check_visible()
    tok = _tokenizer(*tokenizer)
    counts = documents.Counts(echo=False)
    docs = {s: [] for s in shards.SPLITS}
    for texts in documents.text_units([(path, span)], counts, o):
      for split, chunks in counts.take(documents.tokenize_texts(tok, texts, o.max_length, o.eval_fraction)):
        docs[split].append(chunks)
  except (errors.DataError, errors.StorageError) as e:
    return {**out, 'error': {'storage': isinstance(e, errors.StorageError), 'message': str(e)}}
  except FileNotFoundError as e:  # seen by the driver, not by this node: not a shared filesystem
    message = f'{path}: not found on node {out["ip"]} ({e.strerror}); '
    message += 'on a cluster, inputs must be on a bucket or a filesystem every node mounts'
    return {**out, 'error': {'storage': True, 'message': message}}
  width = shards.ID_DTYPES[shards.id_dtype_name(tok.vocab_size)]
  records, doc_tokens = {}, {}
  for split, chunks in docs.items():
    records[split], doc_tokens[split] = _records(chunks, width)
  out.update(
    counts.as_dict(),
    tokens=int(sum(r['lengths'].sum() for r in records.values())),
    cpu_seconds=round(time.process_time() - cpu, 3),
  )  # the node's work, whatever else loads the machine
  ledger.write_unit(index, records, out, doc_tokens)
  return {**out, 'doc_tokens': doc_tokens}


def assemble_shard(
  split: str, index: int, pieces: list, shard_bytes: int, id_dtype: str, ledger: Ledger, output: str
) -> dict:
  """Pass 2 for one shard: the documents [first, end) of each (unit, first, end) of `pieces`, in order."""
  bucket.install()
  base = os.path.join(output, WORK) if not paths.is_url(output) else publish.scratch_root()
  tmp = os.path.join(base, f'tmp-{os.getpid()}-{split}-{index}')
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    writer = shards.ShardWriter(tmp, split, shard_bytes, id_dtype=id_dtype, first_index=index)
    for unit, first, end in pieces:
      r = ledger.read_records(unit, split)
      rec_at = np.concatenate([[0], np.cumsum(r['lengths'], dtype=np.int64)])
      doc_at = np.concatenate([[0], np.cumsum(r['per_doc'], dtype=np.int64)])
      for d in range(first, end):
        writer.write_document([r['ids'][rec_at[k] : rec_at[k + 1]] for k in range(doc_at[d], doc_at[d + 1])])
    made = writer.close()['shards']
    if len(made) != 1:  # the plan and the writer apply one rule (shards.Rollover): anything else is a bug
      raise AssertionError(f'{split} shard {index}: the plan made {len(made)} shards')
    entry = made[0]
    for name in shards.files_of(entry):  # the ledger lists an entry only once its files are in place
      publish.put_file(os.path.join(tmp, name), paths.Path(f'{output.rstrip("/")}/{name}'))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  result = {'entry': entry, 'pieces': [list(p) for p in pieces], **node()}
  ledger.write_shard(entry['file'], result)
  return result
