"""Reading raw documents: text, JSONL and Parquet files, plain or .gz/.zst, local or on a bucket (gs://).

Everything here is sequential and deterministic: files in sorted order, documents
in file order, so `prepare` produces the same shards whatever its worker count.
Bytes that are not UTF-8 are reported with the file and byte offset (into the
decompressed stream) through `on_issue`, then replaced with U+FFFD or, with
on_decode_error='fail', raised. Bucket inputs are read as streams through etils.epath (paths.py), so the same
readers serve both; their names stay URLs in the manifest and in every message.
"""

import contextlib
import dataclasses
import glob
import gzip
import io
import json
import os
from typing import Callable, Iterator, Sequence

from neobert_jax import errors, paths

TEXT_EXTS = ('.txt', '.text')
JSONL_EXTS = ('.jsonl', '.ndjson', '.json')
PARQUET_EXTS = ('.parquet',)
COMPRESSION_EXTS = ('.gz', '.zst', '.zstd')
TEXT_MODES = ('line', 'blank', 'file')


@dataclasses.dataclass(frozen=True)
class Document:
  text: str
  path: str
  offset: int  # byte offset of the document's start (row index for Parquet)


@dataclasses.dataclass(frozen=True)
class DecodeIssue:
  path: str
  offset: int
  reason: str

  def __str__(self):
    return f'{self.path}: undecodable bytes at byte offset {self.offset} ({self.reason})'


class InputError(errors.DataError):
  """A problem with the user's input files, worded for the command line."""


def split_ext(path: str) -> tuple[str, str]:
  """('jsonl'|'text'|'parquet', '.gz'|'.zst'|'')."""
  base, comp = path.lower(), ''
  for c in COMPRESSION_EXTS:
    if base.endswith(c):
      base, comp = base[:-len(c)], c
      break
  for fmt, exts in (('text', TEXT_EXTS), ('jsonl', JSONL_EXTS), ('parquet', PARQUET_EXTS)):
    if base.endswith(exts):
      return fmt, comp
  return '', comp


def expand_inputs(inputs: Sequence[str]) -> list[str]:
  """Files named by paths, globs and directories (searched recursively), sorted."""
  files: list[str] = []
  for item in inputs:
    if paths.is_url(item):
      found = _expand_url(item)
    elif os.path.isdir(item):
      found = sorted(os.path.join(d, f) for d, _, fs in os.walk(item) for f in fs
                     if split_ext(f)[0])
      if not found:
        raise InputError(f'{item}: directory holds no .txt/.jsonl/.json/.parquet files '
                         '(optionally .gz/.zst)')
    elif any(c in item for c in '*?['):
      found = sorted(f for f in glob.glob(item, recursive=True) if os.path.isfile(f))
      if not found:
        raise InputError(f'{item}: pattern matches no files')
    elif os.path.isfile(item):
      found = [item]
    else:
      raise InputError(f'{item}: no such file or directory')
    files.extend(found)
  seen = set()
  return [f for f in files if not (f in seen or seen.add(f))]


def _expand_url(item: str) -> list[str]:
  """expand_inputs for one gs:// item. `**` is refused: epath would list the whole bucket below it, object by
  object; a directory is searched recursively instead."""
  url = paths.resolve(item, '--input')
  if any(c in item for c in '*?['):
    if '**' in item:
      raise InputError(f'{item}: ** is not supported on a bucket; pass the directory (searched recursively) or '
                       'a pattern with * in the file name')
    parts = os.fspath(url).split('/')
    base = next(i for i, p in enumerate(parts) if any(c in p for c in '*?['))
    found = sorted(os.fspath(p) for p in paths.Path('/'.join(parts[:base])).glob('/'.join(parts[base:]))
                   if not p.is_dir())
    if not found:
      raise InputError(f'{item}: pattern matches no objects')
    return found
  if url.is_dir():
    found = sorted(os.fspath(p) for p in _walk(url) if split_ext(p.name)[0])
    if not found:
      raise InputError(f'{item}: holds no .txt/.jsonl/.json/.parquet objects (optionally .gz/.zst)')
    return found
  if url.exists():
    return [os.fspath(url)]
  raise InputError(f'{item}: no such object or directory (or the bucket does not exist)')


def _walk(directory: paths.Path):
  for p in directory.iterdir():
    if p.is_dir():
      yield from _walk(p)
    else:
      yield p


def _open_file(path: str):
  return paths.Path(path).open('rb') if paths.is_url(path) else open(path, 'rb')


@contextlib.contextmanager
def _open_binary(path: str, comp: str) -> Iterator[io.BufferedIOBase]:
  with _open_file(path) as raw:
    if comp == '.gz':
      with gzip.GzipFile(fileobj=raw, mode='rb') as f:
        yield f
    elif comp in ('.zst', '.zstd'):
      import zstandard  # pylint: disable=g-import-not-at-top
      with io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)) as f:
        yield f
    else:
      yield raw


def _lines(path: str, comp: str) -> Iterator[tuple[bytes, int]]:
  """(line bytes, offset) pairs; turns decompression failures into InputError."""
  offset = 0
  try:
    with _open_binary(path, comp) as f:
      for line in f:
        yield line, offset
        offset += len(line)
  except (EOFError, gzip.BadGzipFile, OSError) as e:
    if not comp:
      raise
    raise InputError(f'{path}: cannot decompress after byte {offset} ({e})') from e
  except Exception as e:  # zstandard.ZstdError has no importable base here
    if type(e).__name__ == 'ZstdError':
      raise InputError(f'{path}: cannot decompress after byte {offset} ({e})') from e
    raise


def _decode(raw: bytes, path: str, offset: int, policy: str,
            on_issue: Callable[[DecodeIssue], None]) -> str:
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError as e:
    issue = DecodeIssue(path, offset + e.start, e.reason)
    if policy == 'fail':
      raise InputError(str(issue)) from e
    on_issue(issue)
    return raw.decode('utf-8', errors='replace')


def _text_documents(path, comp, mode, policy, on_issue):
  if mode == 'line':
    for raw, off in _lines(path, comp):
      yield Document(_decode(raw, path, off, policy, on_issue).rstrip('\r\n'), path, off)
    return
  if mode == 'file':
    parts = [(raw, off) for raw, off in _lines(path, comp)]
    text = ''.join(_decode(r, path, o, policy, on_issue) for r, o in parts)
    yield Document(text, path, 0)
    return
  # 'blank': paragraphs separated by one or more blank lines.
  buf, start = [], 0
  for raw, off in _lines(path, comp):
    line = _decode(raw, path, off, policy, on_issue)
    if line.strip():
      if not buf:
        start = off
      buf.append(line)
    elif buf:
      yield Document(''.join(buf).rstrip('\r\n'), path, start)
      buf = []
  if buf:
    yield Document(''.join(buf).rstrip('\r\n'), path, start)


def _jsonl_documents(path, comp, field, policy, on_issue):
  for lineno, (raw, off) in enumerate(_lines(path, comp), start=1):
    line = _decode(raw, path, off, policy, on_issue)
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise InputError(f'{path}:{lineno} (byte {off}): not valid JSON ({e.msg})') from e
    if not isinstance(obj, dict) or field not in obj:
      have = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
      raise InputError(f'{path}:{lineno}: no field {field!r} (found {have}); '
                       'choose one with --text-field')
    text = obj[field]
    if text is None:
      text = ''
    if not isinstance(text, str):
      raise InputError(f'{path}:{lineno}: field {field!r} is {type(text).__name__}, not text')
    yield Document(text, path, off)


def _parquet_documents(path, column):
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  with contextlib.ExitStack() as stack:
    # Local files by name: pyarrow reads them natively, faster than through a Python file object.
    source = stack.enter_context(_open_file(path)) if paths.is_url(path) else path
    try:
      pf = pq.ParquetFile(source)
    except Exception as e:
      raise InputError(f'{path}: not a readable Parquet file ({e})') from e
    names = pf.schema_arrow.names
    if column not in names:
      raise InputError(f'{path}: no column {column!r} (columns: {names}); '
                       'choose one with --text-field')
    row = 0
    for batch in pf.iter_batches(columns=[column], batch_size=4096):
      for text in batch.column(0).to_pylist():
        if text is not None and not isinstance(text, str):
          raise InputError(f'{path}: row {row}: column {column!r} is not a string column')
        yield Document(text or '', path, row)
        row += 1


def iter_documents(path: str, *, text_field: str = 'text', text_mode: str = 'line',
                   on_decode_error: str = 'replace',
                   on_issue: Callable[[DecodeIssue], None] = lambda _: None
                   ) -> Iterator[Document]:
  """Documents of one file, empty ones included (the caller counts and skips them)."""
  fmt, comp = split_ext(path)
  if text_mode not in TEXT_MODES:
    raise ValueError(f'text_mode must be one of {TEXT_MODES}, got {text_mode!r}')
  if on_decode_error not in ('replace', 'fail'):
    raise ValueError(f"on_decode_error must be 'replace' or 'fail', got {on_decode_error!r}")
  if fmt == 'text':
    yield from _text_documents(path, comp, text_mode, on_decode_error, on_issue)
  elif fmt == 'jsonl':
    yield from _jsonl_documents(path, comp, text_field, on_decode_error, on_issue)
  elif fmt == 'parquet':
    if comp:
      raise InputError(f'{path}: compress Parquet internally, not as a {comp} file')
    yield from _parquet_documents(path, text_field)
  else:
    raise InputError(f'{path}: unknown file type (want .txt/.jsonl/.json/.parquet, '
                     'optionally .gz/.zst)')
