"""`prepare`: raw text files -> ArrayRecord shards of token ids + manifest.json.

  python -m neobert_jax.data.prepare --input 'corpus/*.jsonl.zst' --output data/web \
      --tokenizer bert-base-uncased --max-length 1024 --workers 8 --eval-fraction 0.01

One record per document chunk: [CLS] ids [SEP], at most max_length ids. Longer
documents become several consecutive records instead of being truncated.
The main process reads documents in a fixed order and groups them into units;
workers only tokenize, and results are written back in unit order, so the shards
are byte-identical for any --workers. The held-out split is chosen by a hash of
each document's text, so it is stable too (and duplicates land together).
Inputs and output may be on a bucket (gs://...): inputs are streamed (sources.py),
shards are written to local scratch and uploaded, manifest last (publish.py), so
they are byte-identical to a local prepare's.
"""

import collections
import hashlib
import multiprocessing
import os
import shlex
import shutil
import sys
import time
from typing import Iterable, Iterator, Sequence

import numpy as np

from neobert_jax import commandline, errors, paths
from neobert_jax.data import publish
from neobert_jax.data import shards as shards_lib
from neobert_jax.data import sources
from neobert_jax.data import tokenizer as tokenizer_lib

_UNIT_CHARS = 1 << 20  # ~1 MB of text per task: big enough to hide IPC costs
_UNIT_DOCS = 1024
_MAX_REPORTED_ISSUES = 100
_TOKENIZER = None  # per-worker tokenizer, built once by _init_worker


def chunk_document(ids: np.ndarray, max_length: int, cls_id: int, sep_id: int
                   ) -> list[np.ndarray]:
  """Splits a document's ids into [CLS] ... [SEP] records of <= max_length ids."""
  body = max_length - 2
  out = []
  for start in range(0, max(len(ids), 1), body):
    rec = np.empty(min(body, len(ids) - start) + 2, np.int32)
    rec[0], rec[-1] = cls_id, sep_id
    rec[1:-1] = ids[start:start + body]
    out.append(rec)
  return out


def is_eval_document(text: str, eval_fraction: float) -> bool:
  if eval_fraction <= 0:
    return False
  h = int.from_bytes(hashlib.blake2b(text.encode('utf-8'), digest_size=8).digest(), 'little')
  return h / 2.0**64 < eval_fraction


def _init_worker(tokenizer_path: str) -> None:
  global _TOKENIZER
  # One process = one core: keep HF tokenizers from spawning its own threads,
  # so the worker count is the real parallelism (and the scaling figure honest).
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'
  _TOKENIZER = tokenizer_lib.load_tokenizer(tokenizer_path)


def _tokenize_unit(task):
  texts, max_length, eval_fraction = task
  tok = _TOKENIZER
  out = []
  for text, ids in zip(texts, tok.encode_batch(texts)):
    if ids.size == 0:
      out.append(None)  # e.g. only control characters: nothing to learn from
    else:
      out.append((is_eval_document(text, eval_fraction),
                  chunk_document(ids, max_length, tok.cls_id, tok.sep_id)))
  return out


def _ordered_map(fn, tasks: Iterable, workers: int, initargs: tuple) -> Iterator:
  """fn over tasks in order; at most 2 tasks per worker in flight (bounded memory)."""
  if workers <= 0:
    _init_worker(*initargs)
    for t in tasks:
      yield fn(t)
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


class _Counts:
  def __init__(self):
    self.input_documents = 0
    self.skipped_empty = 0
    self.split_documents = 0
    self.issues: list[str] = []
    self.issue_count = 0

  def on_issue(self, issue: sources.DecodeIssue) -> None:
    self.issue_count += 1
    if len(self.issues) < _MAX_REPORTED_ISSUES:
      self.issues.append(str(issue))
    print(f'warning: {issue}; replaced with U+FFFD', file=sys.stderr)


def _units(files, counts: _Counts, text_field, text_mode, on_decode_error):
  """Non-empty document texts grouped into units, in file order."""
  texts, size = [], 0
  for path in files:
    for doc in sources.iter_documents(path, text_field=text_field, text_mode=text_mode,
                                      on_decode_error=on_decode_error,
                                      on_issue=counts.on_issue):
      counts.input_documents += 1
      if not doc.text.strip():
        counts.skipped_empty += 1
        continue
      texts.append(doc.text)
      size += len(doc.text)
      if size >= _UNIT_CHARS or len(texts) >= _UNIT_DOCS:
        yield texts
        texts, size = [], 0
  if texts:
    yield texts


_TMP_PREFIX = '.prepare-tmp-'


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


def remove_stale_tmp(output_dir: str) -> list[str]:
  """Removes `.prepare-tmp-<pid>` directories left in `output_dir` by a prepare that was killed; returns them.

  A killed run (SIGKILL, OOM, a lost node) never reaches its cleanup, and its half-written shards can be as
  large as the corpus. A directory whose process still runs on this machine is another prepare at work and is
  left alone (the pid test cannot see other hosts: do not run two prepares into one directory from two hosts).
  """
  removed = []
  for name in sorted(os.listdir(output_dir)):
    path = os.path.join(output_dir, name)
    pid = name[len(_TMP_PREFIX):]
    if not (name.startswith(_TMP_PREFIX) and pid.isdigit() and os.path.isdir(path)):
      continue
    if int(pid) != os.getpid() and _alive(int(pid)):
      print(f'prepare: {path} belongs to a running process {pid}; left alone', file=sys.stderr)
      continue
    shutil.rmtree(path, ignore_errors=True)
    removed.append(path)
    print(f'prepare: removed {path}, left behind by an interrupted prepare (process {pid})', file=sys.stderr)
  return removed


def prepare(inputs: Sequence[str], output_dir: str, *, tokenizer: str = 'bert-base-uncased',
            max_length: int = 1024, workers: int = 0, eval_fraction: float = 0.01,
            text_field: str = 'text', text_mode: str = 'line',
            on_decode_error: str = 'replace', shard_mb: float = 256.0,
            overwrite: bool = False, progress: bool = False,
            command: str | None = None) -> dict:
  """Tokenizes `inputs` into `output_dir`; returns the manifest it wrote."""
  if max_length < 3:
    raise ValueError(f'max_length must be >= 3 ([CLS] + a token + [SEP]), got {max_length}')
  if not 0 <= eval_fraction < 1:
    raise ValueError(f'eval_fraction must be in [0, 1), got {eval_fraction}')
  files = sources.expand_inputs(inputs)
  tok = tokenizer_lib.load_tokenizer(tokenizer)
  bucket = paths.resolve(output_dir, '--output') if paths.is_url(output_dir) else None
  if bucket is not None:  # shards are written to local scratch, then uploaded (publish.py)
    publish.check_output(bucket, overwrite)
    work = publish.scratch_root()
  else:
    if os.path.exists(os.path.join(output_dir, shards_lib.MANIFEST)) and not overwrite:
      raise FileExistsError(f'{output_dir} already holds prepared data (pass --overwrite)')
    os.makedirs(output_dir, exist_ok=True)
    work = output_dir
  remove_stale_tmp(work)
  tmp = os.path.join(work, f'{_TMP_PREFIX}{os.getpid()}')
  os.makedirs(tmp)
  start = time.time()
  try:
    counts = _Counts()
    limit = int(shard_mb * 2**20)
    writers = {s: shards_lib.ShardWriter(tmp, s, limit) for s in shards_lib.SPLITS}
    tasks = ((u, max_length, eval_fraction)
             for u in _units(files, counts, text_field, text_mode, on_decode_error))
    bar = _progress_bar(progress)
    try:
      for results in _ordered_map(_tokenize_unit, tasks, workers, (tok.path,)):
        for res in results:
          if res is None:
            counts.skipped_empty += 1
            continue
          held_out, chunks = res
          counts.split_documents += len(chunks) > 1
          writers['eval' if held_out else 'train'].write_document(chunks)
        if bar is not None:
          bar.update(len(results))
          bar.set_postfix(tokens=writers['train'].tokens + writers['eval'].tokens)
    finally:
      if bar is not None:
        bar.close()
    splits = {s: w.close() for s, w in writers.items()}
    if splits['train']['documents'] == 0:
      raise sources.InputError(
          f'no documents with text in {len(files)} file(s) ({counts.input_documents} read, '
          f'{counts.skipped_empty} empty); the corpus is empty')
    manifest = {
        'format': shards_lib.FORMAT,
        'tokenizer': tok.identity(),
        'max_length': max_length,
        'eval_fraction': eval_fraction,
        'splits': splits,
        'input_files': files,
        'input_documents': counts.input_documents,
        'skipped_empty_documents': counts.skipped_empty,
        'split_long_documents': counts.split_documents,
        'decode_errors': {'count': counts.issue_count, 'first': counts.issues},
        'command': command or f'prepare({list(inputs)!r}, {output_dir!r}, ...)',
        'workers': workers,
        'seconds': round(time.time() - start, 3),
    }
    if bucket is not None:
      publish.upload(tmp, bucket, manifest)
    else:
      _install(tmp, output_dir, manifest)
    return manifest
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _install(tmp: str, output_dir: str, manifest: dict) -> None:
  """Moves finished shards into place; the manifest goes last, atomically."""
  old = os.path.join(output_dir, shards_lib.MANIFEST)
  if os.path.exists(old):
    os.remove(old)  # from here on the directory reads as incomplete
  for name in os.listdir(output_dir):
    if name.endswith('.arrayrecord'):
      os.remove(os.path.join(output_dir, name))
  for split in manifest['splits'].values():
    for shard in split['shards']:
      os.replace(os.path.join(tmp, shard['file']), os.path.join(output_dir, shard['file']))
  shards_lib.write_manifest(output_dir, manifest)


def _progress_bar(enabled: bool):
  if not enabled:
    return None
  import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm.tqdm(unit='doc', desc='prepare', mininterval=1.0)


def main(argv: Sequence[str] | None = None) -> dict:
  """The command line; returns the manifest. An expected error is one line on stderr and SystemExit with the data
  error status (neobert_jax/errors.py); --debug shows the traceback instead."""
  argv = list(sys.argv[1:] if argv is None else argv)
  debug = errors.take_debug_flag(argv)
  p = commandline.Parser('prepare', 'neobert_jax.data.prepare', __doc__)
  p.add_argument('--input', nargs='+', required=True, action='extend',
                 help='files, globs or directories (.txt/.jsonl/.json/.parquet, .gz/.zst), local or gs://')
  p.add_argument('--output', required=True, help='directory for shards + manifest.json, local or gs://')
  p.add_argument('--tokenizer', default='bert-base-uncased',
                 help="'bert-base-uncased', vocab.txt, tokenizer.json or SentencePiece .model")
  p.add_argument('--max-length', type=int, default=1024, help='ids per record, specials included')
  p.add_argument('--workers', type=int, default=os.cpu_count() or 1,
                 help='tokenizer processes (0: tokenize in this process)')
  p.add_argument('--eval-fraction', type=float, default=0.01,
                 help='share of documents held out for evaluation')
  p.add_argument('--text-field', default='text', help='JSONL field / Parquet column')
  p.add_argument('--text-mode', default='line', choices=sources.TEXT_MODES,
                 help='plain text: a document per line, per blank-line block, or per file')
  p.add_argument('--on-decode-error', default='replace', choices=('replace', 'fail'))
  p.add_argument('--shard-mb', type=float, default=256.0, help='target shard size')
  p.add_argument('--overwrite', action='store_true')
  p.add_argument('--no-progress', action='store_true')
  a = p.parse_args(argv)
  command = 'python -m neobert_jax.data.prepare ' + shlex.join(argv)
  # A missing tokenizer file or an existing output (without --overwrite) are the user's to fix like bad input.
  with errors.reported('prepare', debug, also={FileNotFoundError: errors.DataError, FileExistsError: errors.DataError}):
    m = prepare(a.input, a.output, tokenizer=a.tokenizer, max_length=a.max_length,
                workers=a.workers, eval_fraction=a.eval_fraction, text_field=a.text_field,
                text_mode=a.text_mode, on_decode_error=a.on_decode_error,
                shard_mb=a.shard_mb, overwrite=a.overwrite, progress=not a.no_progress,
                command=command)
  tr, ev = m['splits']['train'], m['splits']['eval']
  print(f"prepared {tr['documents']} train / {ev['documents']} eval documents, "
        f"{tr['tokens'] + ev['tokens']} tokens in {len(tr['shards']) + len(ev['shards'])} "
        f"shards ({m['skipped_empty_documents']} empty skipped, "
        f"{m['decode_errors']['count']} decode errors) in {m['seconds']} s -> {a.output}")
  return m


if __name__ == '__main__':
  main()
