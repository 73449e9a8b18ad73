"""Tokenized examples -> fixed-shape batches ([CLS]/[SEP] framing, truncation, power-of-two length buckets, short final
batches filled with weight-0 rows), so a jitted step compiles once per bucket, not once per batch; and the batched
forward pass over them, results scattered back to input order."""

from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax import sharding as shd


def frame(tok: Any, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int) -> list[np.ndarray]:
  """[CLS] a [SEP] (b [SEP]) ids, truncated to max_length (pairs: the longer side loses tokens first)."""
  a_ids = tok.encode_batch(list(texts))
  b_ids = tok.encode_batch(list(pairs)) if pairs is not None else [None] * len(a_ids)
  out = []
  for a, b in zip(a_ids, b_ids):
    if b is None:
      out.append(np.concatenate([[tok.cls_id], a[: max_length - 2], [tok.sep_id]]).astype(np.int32))
      continue
    budget = max_length - 3
    la, lb = len(a), len(b)
    while la + lb > budget:  # longest-first truncation, as BERT tokenizers do
      if la >= lb:
        la -= 1
      else:
        lb -= 1
    out.append(np.concatenate([[tok.cls_id], a[:la], [tok.sep_id], b[:lb], [tok.sep_id]]).astype(np.int32))
  return out


def buckets(max_length: int, min_bucket: int = 16) -> list[int]:
  """Powers of two from min_bucket up to (and always ending at) max_length."""
  return [1 << e for e in range(int(max_length).bit_length()) if min_bucket <= 1 << e < max_length] + [max_length]


def bucket_for(length: int, bucket_list: Sequence[int]) -> int:
  return next((b for b in bucket_list if length <= b), bucket_list[-1])


def pad_rows(seqs: Sequence[np.ndarray], rows: int, length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """([rows, length] ids, [rows] lengths); missing rows are all padding with length 0."""
  ids = np.full((rows, length), pad_id, np.int32)
  lengths = np.zeros((rows,), np.int32)
  for i, s in enumerate(seqs):
    n = min(len(s), length)
    ids[i, :n] = s[:n]
    lengths[i] = n
  return ids, lengths


def plan_batches(
  lengths: Sequence[int], batch_size: int, bucket_list: Sequence[int], rng: np.random.Generator | None
) -> list[tuple[int, np.ndarray]]:
  """[(bucket length, example indices)] per batch: shuffled with rng (training), else sorted by length."""
  by_bucket: dict[int, list[int]] = {}
  for i, n in enumerate(lengths):
    by_bucket.setdefault(bucket_for(n, bucket_list), []).append(i)
  batches = []
  for b in sorted(by_bucket):
    idx = np.asarray(by_bucket[b])
    idx = rng.permutation(idx) if rng is not None else idx[np.argsort([lengths[i] for i in idx], kind='stable')]
    batches += [(b, idx[s : s + batch_size]) for s in range(0, len(idx), batch_size)]
  if rng is not None:
    batches = [batches[i] for i in rng.permutation(len(batches))]
  return batches


def row_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Rows over the rules' 'batch' axes (data x fsdp), everything else whole."""
  return NamedSharding(mesh, P(shd.logical_to_spec(('batch',))[0]))


def shard_rows(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
  """Host arrays (identical on every process: same files, same seed) -> global arrays sharded by rows."""
  s = row_sharding(mesh)
  return {k: jax.make_array_from_callback(v.shape, s, lambda idx, v=v: v[idx]) for k, v in batch.items()}


def epoch_batches(
  seqs: Sequence[np.ndarray],
  extras: dict[str, np.ndarray],
  batch_size: int,
  bucket_list: Sequence[int],
  pad_id: int,
  rng: np.random.Generator | None,
) -> Iterator[dict[str, np.ndarray]]:
  """One pass: {'input_ids', 'lengths', 'weights', 'index', **extras} per batch (host numpy)."""
  for length, idx in plan_batches([len(s) for s in seqs], batch_size, bucket_list, rng):
    ids, lens = pad_rows([seqs[i] for i in idx], batch_size, length, pad_id)
    weights = (np.arange(batch_size) < len(idx)).astype(np.float32)
    index = np.pad(idx.astype(np.int32), (0, batch_size - len(idx)), constant_values=-1)
    out = {'input_ids': ids, 'lengths': lens, 'weights': weights, 'index': index}
    for k, v in extras.items():  # zeros in the weight-0 rows
      out[k] = np.pad(v[idx], [(0, batch_size - len(idx))] + [(0, 0)] * (v.ndim - 1))
    yield out


def jit_rows(fn: Callable, param_shardings: Any, mesh: jax.sharding.Mesh, rows: int) -> Callable:
  """fn(params, *inputs) jitted for inference: `rows` inputs split by rows, the output replicated for the host."""
  in_shardings = (param_shardings,) + (row_sharding(mesh),) * rows
  return shd.MeshBound(mesh, jax.jit(fn, in_shardings=in_shardings, out_shardings=NamedSharding(mesh, P())))


def jit_forward(model_def: Any, param_shardings: Any, mesh: jax.sharding.Mesh) -> Callable:
  """Jitted (params, input_ids [B, T], lengths [B]) -> model output, replicated for the host to read."""
  forward = lambda params, input_ids, lengths: nnx.merge(model_def, params)(input_ids, lengths)
  return jit_rows(forward, param_shardings, mesh, rows=2)


def run_batched(
  forward: Callable,
  params: Any,
  seqs: Sequence[np.ndarray],
  batch_size: int,
  bucket_list: Sequence[int],
  pad_id: int,
  mesh: jax.sharding.Mesh,
  progress: Any = None,
) -> np.ndarray:
  """forward over all sequences (batch_size rows each, static bucket shapes); [N, ...] float32 in input order."""
  out = None
  for batch in epoch_batches(seqs, {}, batch_size, bucket_list, pad_id, rng=None):
    g = shard_rows({'input_ids': batch['input_ids'], 'lengths': batch['lengths']}, mesh)
    result = np.asarray(forward(params, g['input_ids'], g['lengths']), np.float32)
    real = batch['index'] >= 0
    if out is None:
      out = np.zeros((len(seqs),) + result.shape[1:], np.float32)
    out[batch['index'][real]] = result[real]
    if progress is not None:
      progress.update(int(real.sum()))
  return out if out is not None else np.zeros((0,), np.float32)
