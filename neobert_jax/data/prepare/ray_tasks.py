"""`prepare --engine=ray`'s tasks as plain functions: `tokenize_unit` (pass 1) and `assemble_shard` (pass 2).

Bad input comes back as a value ({'error': ...}), never retried; any exception is a machine's fault and Ray
retries it (every write is whole and the same each time).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time

import numpy as np

from neobert_jax import bucket, errors, paths
from neobert_jax.data import shards
from neobert_jax.data.prepare import documents
from neobert_jax.data.prepare import ledger as ledger_lib
from neobert_jax.data.prepare import publish
from neobert_jax.data import tokenizer as tokenizer_lib

_TOKENIZERS: dict = {}  # per worker process: (spec, sha256) -> Tokenizer


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
      tmp = path.with_name(f'.{name}.{os.getpid()}')
      tmp.write_bytes(blob)
      os.replace(tmp, path)
    tok = tokenizer_lib.load_tokenizer(str(path))
    _TOKENIZERS[key] = tok
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


def tokenize_unit(index: int, path: str, span, cfg: dict, ledger: ledger_lib.Ledger, tokenizer: tuple) -> dict:
  """Pass 1 for one unit: {'index', 'node', 'ip', counts..., 'doc_tokens': {split: array}} or {'error': ...}."""
  bucket.install()  # a worker process reaches the bucket with the driver's retry budget (it resolves no path)
  out, cpu = {'index': index, **node()}, time.process_time()
  try:
    ledger.check_visible()
    tok = _tokenizer(*tokenizer)
    counts = documents.Counts(echo=False)
    docs = {s: [] for s in shards.SPLITS}
    for texts in documents.text_units(
      [(path, span)], counts, cfg['text_field'], cfg['text_mode'], cfg['on_decode_error']
    ):
      results = documents.tokenize_texts(tok, texts, cfg['max_length'], cfg['eval_fraction'])
      for split, chunks in counts.take(results):
        docs[split].append(chunks)
  except (errors.DataError, errors.StorageError) as e:
    return {**out, 'error': {'storage': isinstance(e, errors.StorageError), 'message': str(e)}}
  except FileNotFoundError as e:  # seen by the driver, not by this node: not a shared filesystem
    return {
      **out,
      'error': {
        'storage': True,
        'message': f'{path}: not found on node {out["ip"]} ({e.strerror}); '
        'on a cluster, inputs must be on a bucket or a filesystem every node mounts',
      },
    }
  records, doc_tokens = {}, {}
  width = shards.ID_DTYPES[shards.id_dtype_name(tok.vocab_size)]
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
  split: str,
  index: int,
  pieces: list[tuple[int, int, int]],
  shard_bytes: int,
  id_dtype: str,
  ledger: ledger_lib.Ledger,
  output: str,
) -> dict:
  """Pass 2 for one shard: the documents [first, end) of each (unit, first, end) of `pieces`, in order, their ids
  `id_dtype` wide."""
  bucket.install()
  local_out = not paths.is_url(output)
  base = os.path.join(output, ledger_lib.WORK) if local_out else publish.scratch_root()
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
