"""`prepare` on one machine: raw text files -> ArrayRecord shards of token ids + manifest.json.

  python -m neobert_jax.data.prepare --input 'corpus/*.jsonl.zst' --output data/web --workers 8

Documents are read in a fixed order and workers only tokenize, so the shards are byte-identical for any --workers
(and to a gs:// output's, written to local scratch and uploaded by publish.py).
"""

import collections
import multiprocessing
import os
import shlex
import shutil
import sys
import time
from typing import Any, Iterable, Iterator, Sequence

from neobert_jax import commandline, errors, paths
from neobert_jax import lease as lease_lib
from neobert_jax.data.prepare import documents
from neobert_jax.data.prepare import publish
from neobert_jax.data import shards as shards_lib
from neobert_jax.data.prepare import sources
from neobert_jax.data import tokenizer as tokenizer_lib

_TOKENIZER = None  # per-worker tokenizer, built once by _init_worker
ENGINES = ('local', 'ray')


def _init_worker(tokenizer_path: str) -> None:
  global _TOKENIZER
  # One process = one core: HF tokenizers' own threads would make the worker count a lie.
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'
  _TOKENIZER = tokenizer_lib.load_tokenizer(tokenizer_path)


def _tokenize_unit(task):
  texts, max_length, eval_fraction = task
  return documents.tokenize_texts(_TOKENIZER, texts, max_length, eval_fraction)


def _ordered_map(fn, tasks: Iterable, workers: int, initargs: tuple) -> Iterator:
  """fn over tasks in order; at most 2 tasks per worker in flight (bounded memory)."""
  if workers <= 0:
    _init_worker(*initargs)
    yield from map(fn, tasks)
    return
  # spawn, not fork: callers (tests, the trainer) may hold threads, e.g. JAX's.
  ctx = multiprocessing.get_context('spawn')
  with ctx.Pool(workers, _init_worker, initargs) as pool:
    pending = collections.deque()
    for t in tasks:
      pending.append(pool.apply_async(fn, (t,)))
      if len(pending) >= 2 * workers:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()


_TMP_PREFIX = '.prepare-tmp-'


def remove_stale_tmp(output_dir: str) -> list[str]:
  """Removes (and returns) the `.prepare-tmp-<pid>` directories of killed prepares in `output_dir`, which can be
  as large as the corpus; one whose process still runs here is left alone."""
  removed = []
  for name in sorted(os.listdir(output_dir)):
    path = os.path.join(output_dir, name)
    pid = name[len(_TMP_PREFIX) :]
    if not (name.startswith(_TMP_PREFIX) and pid.isdigit() and os.path.isdir(path)):
      continue
    if int(pid) != os.getpid() and lease_lib.pid_alive(int(pid)):
      print(f'prepare: {path} belongs to a running process {pid}; left alone', file=sys.stderr)
      continue
    shutil.rmtree(path, ignore_errors=True)
    removed.append(path)
    print(f'prepare: removed {path}, left behind by an interrupted prepare (process {pid})', file=sys.stderr)
  return removed


def prepare_local(
  inputs: Sequence[str],
  output_dir: str,
  options: documents.BuildOptions | None = None,
  *,
  workers: int = 0,
  **fields: Any,
) -> dict:
  """Tokenizes `inputs` into `output_dir` with `workers` processes as `options` (or its fields) say; the manifest."""
  o = documents.BuildOptions.of(options, fields)
  with lease_lib.acquire(output_dir, '--output'):  # one build per output, before anything there is read
    return _prepare(inputs, output_dir, o, workers)


def _prepare(inputs: Sequence[str], output_dir: str, o: documents.BuildOptions, workers: int) -> dict:
  files = sources.expand_inputs(inputs)
  tok = tokenizer_lib.load_tokenizer(o.tokenizer)
  out = publish.open_output(output_dir, o.overwrite)
  # Shards bound for a bucket are written to local scratch, then uploaded (publish.py).
  work = output_dir if paths.local(out) else publish.scratch_root()
  remove_stale_tmp(work)
  tmp = os.path.join(work, f'{_TMP_PREFIX}{os.getpid()}')
  os.makedirs(tmp)
  start = time.time()
  try:
    counts = documents.Counts()
    width = shards_lib.id_dtype_name(tok.vocab_size)
    writers = {s: shards_lib.ShardWriter(tmp, s, o.shard_bytes, id_dtype=width) for s in shards_lib.SPLITS}
    tasks = (
      (texts, o.max_length, o.eval_fraction) for texts in documents.text_units([(f, None) for f in files], counts, o)
    )
    with documents.progress_bar(o.progress, unit='doc', desc='prepare') as bar:
      for results in _ordered_map(_tokenize_unit, tasks, workers, (tok.path,)):
        for split, chunks in counts.take(results):
          writers[split].write_document(chunks)
        bar.update(len(results))
        bar.set_postfix(tokens=writers['train'].tokens + writers['eval'].tokens)
    splits = {s: w.close() for s, w in writers.items()}
    call = f'prepare({list(inputs)!r}, {output_dir!r}, ...)'
    manifest = documents.manifest(tok, o, splits, files, counts, call)
    manifest.update(workers=workers, seconds=round(time.time() - start, 3))
    made = shards_lib.Manifest.of(manifest, output_dir)
    if paths.local(out):  # moved into place as the Ray engine's shards are, the manifest last
      (out / shards_lib.MANIFEST).unlink(missing_ok=True)  # from here on the directory reads as incomplete
      for name in made.files():
        publish.put_file(os.path.join(tmp, name), out / name)
      publish.commit(out, made)
    else:
      publish.upload(tmp, out, made)
    return manifest
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> dict:
  """The command line; returns the manifest. An expected error is one line on stderr (--debug: the traceback)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  debug = errors.take_debug_flag(argv)
  p = commandline.Parser('prepare', 'neobert_jax.data.prepare', __doc__)
  d = documents.BuildOptions()  # the flags' defaults
  p.add_argument(
    '--input',
    nargs='+',
    required=True,
    action='extend',
    help='files, globs or directories (.txt/.jsonl/.json/.parquet, .gz/.zst), local or gs://; or a Hugging Face '
    'dataset: hf:ID[:CONFIG[:SPLIT]] (streamed) or a save_to_disk folder',
  )
  p.add_argument('--output', required=True, help='directory for shards + manifest.json, local or gs://')
  p.add_argument(
    '--tokenizer', default=d.tokenizer, help="'bert-base-uncased', vocab.txt, tokenizer.json or SentencePiece .model"
  )
  p.add_argument('--max-length', type=int, default=d.max_length, help='ids per record, specials included')
  p.add_argument(
    '--workers', type=int, default=os.cpu_count() or 1, help='tokenizer processes (0: tokenize in this process)'
  )
  p.add_argument(
    '--eval-fraction', type=float, default=d.eval_fraction, help='share of documents held out for evaluation'
  )
  p.add_argument('--text-field', default=d.text_field, help='JSONL field / Parquet column')
  p.add_argument(
    '--text-mode',
    default=d.text_mode,
    choices=sources.TEXT_MODES,
    help='plain text: a document per line, per blank-line block, or per file',
  )
  p.add_argument('--on-decode-error', default=d.on_decode_error, choices=('replace', 'fail'))
  p.add_argument('--shard-mb', type=float, default=d.shard_mb, help='target shard size')
  p.add_argument('--overwrite', action='store_true')
  p.add_argument('--no-progress', action='store_true')
  p.add_argument(
    '--engine',
    default='local',
    choices=ENGINES,
    help='local: --workers processes on this machine; ray: the tasks of a Ray cluster (same shards)',
  )
  p.add_argument(
    '--ray-address',
    default='auto',
    help="--engine=ray: the cluster, 'auto' (the one this node belongs to) or HOST:PORT",
  )
  p.add_argument(
    '--split-mb',
    type=float,
    default=64.0,
    help='--engine=ray: input per task; larger files are cut (byte ranges, row groups, .zst frames)',
  )
  a = p.parse_args(argv)
  command = 'python -m neobert_jax.data.prepare ' + shlex.join(argv)
  # A missing tokenizer file or an existing output (without --overwrite) are the user's to fix like bad input.
  with errors.reported('prepare', debug, also={FileNotFoundError: errors.DataError, FileExistsError: errors.DataError}):
    cores = os.cpu_count() or 1
    if not 0 <= a.workers <= 4 * cores:  # each worker is a process: thousands would exhaust the machine
      raise errors.ConfigError(
        f'--workers={a.workers}: must be 0 (tokenize in this process) to {4 * cores} (4 per core of this machine)'
      )
    if not 0 < a.split_mb < float('inf'):
      raise errors.ConfigError(f'--split-mb={a.split_mb}: must be a positive number of megabytes, e.g. 64')
    kept = ('tokenizer', 'max_length', 'eval_fraction', 'text_field', 'text_mode', 'on_decode_error', 'shard_mb')
    options = documents.BuildOptions(
      **{f: getattr(a, f) for f in kept}, overwrite=a.overwrite, progress=not a.no_progress, command=command
    )
    if a.engine == 'ray':
      from neobert_jax.data.prepare import ray_engine as prepare_ray  # pylint: disable=g-import-not-at-top

      m = prepare_ray.prepare_on_ray(a.input, a.output, options, ray_address=a.ray_address, split_mb=a.split_mb)
    else:
      m = prepare_local(a.input, a.output, options, workers=a.workers)
  tr, ev = m['splits']['train'], m['splits']['eval']
  print(
    f'prepared {tr["documents"]} train / {ev["documents"]} eval documents, '
    f'{tr["tokens"] + ev["tokens"]} tokens in {len(tr["shards"]) + len(ev["shards"])} '
    f'shards ({m["skipped_empty_documents"]} empty skipped, '
    f'{m["decode_errors"]["count"]} decode errors) in {m["seconds"]} s -> {a.output}'
  )
  return m
