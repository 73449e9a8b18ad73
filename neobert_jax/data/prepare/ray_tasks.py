"""`prepare --engine=ray` on the nodes: the work area (`Ledger`) and the tasks, `tokenize_unit` (pass 1) and
`assemble_shard` (pass 2), as plain functions.

The work area, OUTPUT/.prepare-work, is what a build has finished, seen by every node and by a re-run: build.json
(the build's identity), units/NNNNNN.SPLIT.npz (records), units/NNNNNN.done.npz (counts, written last: the unit's
entry), shards/NAME.json (a shard in place, with its plan). Every object is written whole. Bad input comes back as
a value ({'error': ...}), never retried; any exception is a machine's fault and Ray retries it (every write is whole
and the same each time).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
import shutil
import time

import numpy as np

from neobert_jax import bucket, errors, paths
from neobert_jax.data import shards
from neobert_jax.data.prepare import documents
from neobert_jax.data.prepare import publish
from neobert_jax.data.prepare import sources
from neobert_jax.data import tokenizer as tokenizer_lib

WORK = '.prepare-work'
_PARALLEL = 16  # object-store reads of a resumed build's entries at once (each is a small request)
_TOKENIZERS: dict = {}  # per worker process: (spec, sha256) -> Tokenizer


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
        list(pool.map(lambda p: p.unlink(missing_ok=True), list(sources.walk(root))))


def node() -> dict:
  import ray  # pylint: disable=g-import-not-at-top

  return {'node': ray.get_runtime_context().get_node_id(), 'ip': ray.util.get_node_ip_address()}


def _tokenizer(spec: str, name: str, blob: bytes):
  """The driver's tokenizer file, shipped as bytes (a node need not have it, nor the driver's paths)."""
  key = (spec, hashlib.sha256(blob).hexdigest())
  if key not in _TOKENIZERS:
    os.environ['TOKENIZERS_PARALLELISM'] = 'false'  # one task = one CPU, as the local engine's workers
    path = paths.cache_dir('prepare-tokenizers', key[1][:16]) / name
    if not path.exists():
      paths.write_bytes(path, blob)
    _TOKENIZERS[key] = tokenizer_lib.load_tokenizer(str(path))
  return _TOKENIZERS[key]


def _records(chunks: list[list[np.ndarray]], dtype: np.dtype) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """Documents' records as flat arrays (ids `dtype` wide as in the shards, record lengths, records per document),
  and each one's tokens."""
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
  """Pass 2 for one shard: the documents [first, end) of each (unit, first, end) of `pieces`, in order, their ids
  `id_dtype` wide."""
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
    if len(made) != 1:  # the plan and the writer apply one rule (rollover.py): anything else is a bug
      raise AssertionError(f'{split} shard {index}: the plan made {len(made)} shards')
    entry = made[0]
    for name in shards.files_of(entry):  # the ledger lists an entry only once its files are in place
      publish.put_file(os.path.join(tmp, name), paths.Path(f'{output.rstrip("/")}/{name}'))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  result = {'entry': entry, 'pieces': [list(p) for p in pieces], **node()}
  ledger.write_shard(entry['file'], result)
  return result
