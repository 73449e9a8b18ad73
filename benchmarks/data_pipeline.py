"""Training-pipeline throughput: packed + masked batches from prepared shards.

  python -m benchmarks.data_pipeline                  # synthetic, mean doc 494
  python -m benchmarks.data_pipeline --data DIR       # any prepared directory
  python -m benchmarks.data_pipeline --workers 0 2    # also mp_prefetch
  python -m benchmarks.data_pipeline --emulator       # data on a bucket: a local GCS emulator
  python -m benchmarks.data_pipeline --bucket gs://B/P  # data on a real bucket (default credentials)

Prints, per configuration: row tokens/s (batch x seq_len, what the model
consumes), tokens per CPU-second (all threads and worker processes of the
pipeline; the bar is >= 2M per core), the padding fraction each packing mode
leaves, and a per-stage split of one block (read / pack / mask).

With --bucket or --emulator: the built-in corpus (prepared for --seq-len) is uploaded to the bucket, then
fetched back (data.dir=gs://..., data/pipeline/store.py) into a fresh cache folder: upload MiB/s and the fetch time,
then the pipeline's tokens/s from the local directory and from the bucket through the cache, and the read stage
alone (a block of documents at random) from local, fetched and straight from the bucket
(array_record's own gs:// reader; the emulator's address goes to it through CLOUD_STORAGE_EMULATOR_ENDPOINT).

A script, not part of the library (nothing imports it): run it from the repository root as above, or as
`python benchmarks/data_pipeline.py` where the package is installed.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import psutil

from neobert_jax.config import data as config_lib
from neobert_jax.data import shards
from tests.support import pipeline_data, synthetic_data
from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import packing
from neobert_jax.data.pipeline import prepared
from neobert_jax.data.pipeline import virtual
from neobert_jax.data import pipeline


def synthetic_dir(root: str, n_docs: int, mean_len: int, seq_len: int) -> str:
  """Documents with exponential lengths (web text is roughly so), mean `mean_len`."""
  rng = np.random.default_rng(0)
  lengths = np.clip(rng.exponential(mean_len, n_docs).astype(np.int64), 3, seq_len)
  docs = [rng.integers(1000, 30522, n).astype(np.int32) for n in lengths]
  for d in docs:
    d[0], d[-1] = synthetic_data.SPECIAL['cls'], synthetic_data.SPECIAL['sep']
  synthetic_data.write_prepared(root, docs, max_length=seq_len, shard_bytes=64 << 20)
  return root


def _cpu_seconds(proc: psutil.Process) -> float:
  """CPU time of this process (all threads) plus its live children (mp workers)."""
  total = sum(proc.cpu_times()[:2])
  for child in proc.children(recursive=True):
    try:
      total += sum(child.cpu_times()[:2])
    except psutil.NoSuchProcess:
      pass
  return total


def measure(cfg, batch: int, seq_len: int, seconds: float) -> dict:
  it = pipeline.make_train_iterator(cfg, batch, seq_len, seed=0)
  proc = psutil.Process()
  for _ in range(2 + cfg.num_workers * cfg.worker_buffer_size):  # start-up, worker spawn
    next(it)
  slots = real = chosen = steps = 0
  t0, c0 = time.perf_counter(), _cpu_seconds(proc)
  while time.perf_counter() - t0 < seconds:
    b = next(it)
    steps += 1
    slots += b['input_ids'].size
    real += int((b['segment_ids'] > 0).sum())
    chosen += int((b['labels'] >= 0).sum())
  wall, cpu = time.perf_counter() - t0, _cpu_seconds(proc) - c0
  it.close()  # stops prefetch threads/workers before the next measurement
  return {
    'steps': steps,
    'tokens_per_s': slots / wall,
    'tokens_per_cpu_s': slots / cpu,
    'cpu_cores_busy': cpu / wall,
    'padding': 1 - real / slots,
    'masked': chosen / real,
  }


def stage_split(directory: str, cfg, seq_len: int) -> dict:
  """CPU seconds (this thread) per million tokens for each stage of a block, read as training reads it
  (virtual.ShardBlocks through the store).

  Process CPU time, not wall time, so other jobs on the machine do not inflate it.
  """
  m = shards.Manifest.read(directory)
  listed = m.shards('train')
  counts = [s['records'] for s in listed]
  stream = virtual.ShardStream(
    virtual.pieces(counts, 0, sum(counts)), seed=0, shard=0, window=cfg.shuffle_window, shuffle=True
  )
  store = prepared.open_store(directory, m, 'train', listed, cfg.cache_gb, 0)
  blocks = virtual.ShardBlocks(stream, store, [s['file'] for s in listed], cfg.block_docs, m.id_dtype)
  special = m.special_ids
  table = masking.special_table(m.vocab_size, special.values())
  out = {'read': 0.0, 'pack': 0.0, 'mask': 0.0}
  n_tok = 0
  for i in range(3):
    t = time.process_time()
    tokens, lengths = blocks[i]
    t1 = time.process_time()
    rows = packing.pack_block(tokens, lengths, seq_len, cfg.packing, special['pad'], np.random.default_rng(i))
    t2 = time.process_time()
    masking.mask_rows(
      rows['input_ids'],
      rows['segment_ids'],
      np.random.default_rng(i),
      rate=cfg.mask_rate,
      strategy=cfg.mask_strategy,
      mask_id=special['mask'],
      is_special=table,
      max_predictions=cfg.max_predictions,
    )
    t3 = time.process_time()
    out['read'] += t1 - t
    out['pack'] += t2 - t1
    out['mask'] += t3 - t2
    n_tok += tokens.size
  return {k: v / n_tok * 1e6 for k, v in out.items()}


def _random_reads(urls: list[str], n: int, id_bytes: int) -> tuple[float, float]:
  """(records/s, Mtok/s) of reading n records at random (ids `id_bytes` wide), one by one, as the pipeline's read
  stage does."""
  import grain  # pylint: disable=g-import-not-at-top

  source = grain.sources.ArrayRecordDataSource(urls)
  order = np.random.default_rng(0).permutation(len(source))[:n]
  t0, tokens = time.perf_counter(), 0
  for i in order:
    tokens += len(source[int(i)]) // id_bytes
  took = time.perf_counter() - t0
  return n / took, tokens / took / 1e6


def bucket_comparison(a) -> None:
  """Data on a bucket against the same data on local disk (see the module docstring)."""
  from neobert_jax import paths  # pylint: disable=g-import-not-at-top
  from neobert_jax.data.prepare import corpus  # pylint: disable=g-import-not-at-top
  from neobert_jax.data.prepare import publish  # pylint: disable=g-import-not-at-top

  emulator = None
  if a.emulator:
    from tests.conftest import gcs_env, start_gcs_emulator  # pylint: disable=g-import-not-at-top

    emulator, endpoint = start_gcs_emulator()
    os.environ.update(gcs_env(endpoint), CLOUD_STORAGE_EMULATOR_ENDPOINT=endpoint)
  try:
    local = corpus.default_prepared_dir(max_length=a.seq_len)
    m = shards.Manifest.read(local)
    url = paths.Path(a.bucket or 'gs://neobert/bench') / f'corpus-L{a.seq_len}'
    mib = sum(s['bytes'] for split in ('train', 'eval') for s in m.shards(split)) / 2**20
    t0 = time.perf_counter()
    publish.upload(local, url, m)
    up = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as cache:
      os.environ['NEOBERT_JAX_CACHE'] = cache  # a cold fetch, whatever this machine fetched before
      bucket_cfg = config_lib.default_data_config()
      bucket_cfg.dir = str(url)
      t0 = time.perf_counter()
      fetched, _ = pipeline_data.split_files(bucket_cfg, a.seq_len, 'train')
      down = time.perf_counter() - t0
      staged = os.path.dirname(fetched[0])
      print(
        f'data: {url} ({mib:.1f} MiB, {len(fetched)} train shards); upload {mib / up:.0f} MiB/s, '
        f'fetching the train split {down:.2f} s'
      )
      print(
        f'{"source":8} {"pipeline Mtok/s":>15} {"random reads/s":>14} {"read Mtok/s":>11}   (packed, '
        f'P {a.max_predictions[-1]}, workers 0, seq_len {a.seq_len}, batch {a.batch}, block_docs {a.block_docs}; '
        f'{a.random_reads} records read at random)'
      )
      files = [s['file'] for s in m.shards('train')]
      for name, data_dir, urls in (
        ('local', local, [os.path.join(local, f) for f in files]),
        ('fetched', str(url), [os.path.join(staged, f) for f in files]),
        ('bucket', None, [f'{url}/{f}' for f in files]),
      ):
        cfg = config_lib.default_data_config()
        cfg.dir, cfg.block_docs, cfg.max_predictions = data_dir, a.block_docs, a.max_predictions[-1]
        tok = (
          f'{measure(cfg, a.batch, a.seq_len, a.seconds)["tokens_per_s"] / 1e6:15.2f}' if data_dir else (f'{"-":>15}')
        )
        per_s, mtok = _random_reads(urls, a.random_reads, m.id_dtype.itemsize)
        print(f'{name:8} {tok} {per_s:14.0f} {mtok:11.3f}', flush=True)
  finally:
    if emulator is not None:
      emulator.terminate()


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--data', default='', help='prepared directory (default: synthetic)')
  p.add_argument('--docs', type=int, default=20000, help='synthetic documents')
  p.add_argument('--mean-len', type=int, default=494, help='synthetic mean document length')
  p.add_argument('--seq-len', type=int, default=1024)
  p.add_argument('--batch', type=int, default=32, help='rows per host batch')
  p.add_argument('--block-docs', type=int, default=4096)
  p.add_argument('--seconds', type=float, default=3.0, help='per configuration')
  p.add_argument('--workers', type=int, nargs='+', default=[0])
  p.add_argument('--max-predictions', type=int, nargs='+', default=[0, 256])
  p.add_argument('--bucket', default='', help='gs:// prefix: compare data there with local data')
  p.add_argument('--emulator', action='store_true', help='as --bucket, on a local GCS emulator')
  p.add_argument('--random-reads', type=int, default=500, help='with --bucket: records read at random per source')
  a = p.parse_args(argv)
  if a.bucket or a.emulator:
    bucket_comparison(a)
    return
  with tempfile.TemporaryDirectory() as tmp:
    directory = a.data or synthetic_dir(tmp, a.docs, a.mean_len, a.seq_len)
    m = shards.Manifest.read(directory)
    tr = m.split('train')
    print(
      f'data: {directory}  {tr["records"]} records, mean length '
      f'{tr["tokens"] / tr["records"]:.0f}, seq_len {a.seq_len}, batch {a.batch}, '
      f'block_docs {a.block_docs}, {os.cpu_count()} CPUs'
    )
    print(
      f'{"packing":8} {"P":>4} {"workers":>7} {"Mtok/s":>7} {"Mtok/cpu-s":>10} '
      f'{"cores":>5} {"padding":>7} {"masked":>6}   CPU ms per Mtok: read pack mask'
    )
    for mode in ('packed', 'none'):
      for pred in a.max_predictions:
        for workers in a.workers:
          cfg = config_lib.default_data_config()
          cfg.dir, cfg.packing, cfg.block_docs = directory, mode, a.block_docs
          cfg.max_predictions, cfg.num_workers = pred, workers
          r = measure(cfg, a.batch, a.seq_len, a.seconds)
          s = stage_split(directory, cfg, a.seq_len) if workers == 0 else {}
          split = ' '.join(f'{s[k] * 1e3:5.0f}' for k in ('read', 'pack', 'mask')) if s else ''
          print(
            f'{mode:8} {pred:>4} {workers:>7} {r["tokens_per_s"] / 1e6:7.2f} '
            f'{r["tokens_per_cpu_s"] / 1e6:10.2f} {r["cpu_cores_busy"]:5.2f} '
            f'{r["padding"]:7.3f} {r["masked"]:6.3f}   {split}',
            flush=True,
          )


if __name__ == '__main__':
  main()
