"""Reading raw documents: text, JSONL and Parquet files, plain or .gz/.zst, local or gs:// (through paths.py).
Sequential and deterministic (sorted files, file order), so `prepare` makes the same shards for any worker count.
A file may be read in parts (`Span`, planned by splits.py); the parts' documents concatenated are the file's."""

import contextlib
import dataclasses
import glob
import gzip
import io
import itertools
import json
import os
from typing import Callable, Iterator, Sequence

from neobert_jax import errors, paths
from neobert_jax.data.prepare import hf

FORMATS = {'text': ('.txt', '.text'), 'jsonl': ('.jsonl', '.ndjson', '.json'), 'parquet': ('.parquet',)}
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


@dataclasses.dataclass(frozen=True)
class Span:
  """A part of one file, read alone. Text and JSONL: the lines that start in (start, end] of the decompressed
  stream (the first part also owns byte 0), read from `seek` in the stored file (a .zst frame's offset, else
  `start`); in text_mode 'blank' a part ends after the first blank line starting past `end`, so no paragraph is
  cut. Parquet: row groups [start, end), whose first row is `row`."""

  start: int
  end: int
  seek: int = 0
  row: int = 0


def split_ext(path: str) -> tuple[str, str]:
  """('jsonl'|'text'|'parquet', '.gz'|'.zst'|'')."""
  base = path.lower()
  comp = next((c for c in ('.gz', '.zst', '.zstd') if base.endswith(c)), '')
  base = base[: len(base) - len(comp)]
  return next((fmt for fmt, exts in FORMATS.items() if base.endswith(exts)), ''), comp


def expand_inputs(inputs: Sequence[str]) -> list[str]:
  """Files named by paths, globs and directories (searched recursively), sorted; a Hugging Face dataset stays one."""
  files: list[str] = []
  for item in inputs:
    if hf.is_input(item):
      found = [item]
    elif paths.is_url(item):
      found = _expand_url(item)
    elif os.path.isdir(item):
      found = sorted(os.path.join(d, f) for d, _, fs in os.walk(item) for f in fs if split_ext(f)[0])
      if not found:
        raise errors.DataError(f'{item}: directory holds no .txt/.jsonl/.json/.parquet files (optionally .gz/.zst)')
    elif any(c in item for c in '*?['):
      found = sorted(f for f in glob.glob(item, recursive=True) if os.path.isfile(f))
      if not found:
        raise errors.DataError(f'{item}: pattern matches no files')
    elif os.path.isfile(item):
      found = [item]
    else:
      raise errors.DataError(f'{item}: no such file or directory')
    files.extend(found)
  return list(dict.fromkeys(files))  # each file once, in order


def _expand_url(item: str) -> list[str]:
  """expand_inputs for one gs:// item. `**` is refused: epath would list the whole bucket below it, object by
  object; a directory is searched recursively instead."""
  url = paths.resolve(item, '--input')
  if any(c in item for c in '*?['):
    if '**' in item:
      raise errors.DataError(
        f'{item}: ** is not supported on a bucket; pass the directory (searched recursively) or '
        'a pattern with * in the file name'
      )
    parts = os.fspath(url).split('/')
    base = next(i for i, p in enumerate(parts) if any(c in p for c in '*?['))
    found = sorted(
      os.fspath(p) for p in paths.Path('/'.join(parts[:base])).glob('/'.join(parts[base:])) if not p.is_dir()
    )
    if not found:
      raise errors.DataError(f'{item}: pattern matches no objects')
    return found
  if url.is_dir():
    found = sorted(os.fspath(p) for p in paths.walk(url) if split_ext(p.name)[0])
    if not found:
      raise errors.DataError(f'{item}: holds no .txt/.jsonl/.json/.parquet objects (optionally .gz/.zst)')
    return found
  if url.exists():
    return [os.fspath(url)]
  raise errors.DataError(f'{item}: no such object or directory (or the bucket does not exist)')


def open_file(path: str):
  return paths.Path(path).open('rb') if paths.is_url(path) else open(path, 'rb')


@contextlib.contextmanager
def _open_binary(path: str, comp: str, seek: int = 0) -> Iterator[io.BufferedIOBase]:
  with open_file(path) as raw:
    raw.seek(seek)  # a Span's start (a frame boundary in a .zst)
    if comp == '.gz':
      with gzip.GzipFile(fileobj=raw, mode='rb') as f:
        yield f
    elif comp in ('.zst', '.zstd'):
      import zstandard  # pylint: disable=g-import-not-at-top

      stream = zstandard.ZstdDecompressor().stream_reader(raw, closefd=False, read_across_frames=True)
      with io.BufferedReader(stream) as f:
        yield f
    else:
      yield raw


def _blank(raw: bytes) -> bool:
  return not raw.decode('utf-8', errors='replace').strip()  # the paragraph rule of _text_documents


def _lines(path: str, comp: str, span: Span | None = None, blank: bool = False) -> Iterator[tuple[bytes, int]]:
  """(line bytes, offset) pairs of the file or of its `span` (blank: paragraph mode); bad compression: DataError."""
  offset = span.start if span else 0
  lead = span is not None and span.start > 0  # lines starting at or before `start` belong to the part before
  try:
    with _open_binary(path, comp, span.seek if span else 0) as f:
      for line in f:
        off, offset = offset, offset + len(line)
        if lead:  # what began in the part before: lines up to `start` (paragraph mode: through a blank line)
          lead = not (off > span.start and (not blank or _blank(line)))
          if blank and not lead and off > span.end:
            return  # the blank line that opens this part also closes it: all its lines are in paragraphs before
          if lead or blank:
            continue
        if span is not None and off > span.end:
          if not blank:
            return
          if _blank(line):  # the blank line that closes this part's last paragraph
            yield line, off
            return
        yield line, off
  except Exception as e:  # gzip's OSError or EOFError; zstandard.ZstdError has no importable base here
    if not comp or not (isinstance(e, (EOFError, OSError)) or type(e).__name__ == 'ZstdError'):
      raise
    raise errors.DataError(f'{path}: cannot decompress after byte {offset} ({e})') from e


def _decode(raw: bytes, path: str, offset: int, policy: str, on_issue: Callable[[DecodeIssue], None]) -> str:
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError as e:
    issue = DecodeIssue(path, offset + e.start, e.reason)
    if policy == 'fail':
      raise errors.DataError(str(issue)) from e
    on_issue(issue)
    return raw.decode('utf-8', errors='replace')


def _text_documents(path, comp, mode, policy, on_issue, span):
  if mode == 'line':
    for raw, off in _lines(path, comp, span):
      yield Document(_decode(raw, path, off, policy, on_issue).rstrip('\r\n'), path, off)
    return
  if mode == 'file':
    yield Document(''.join(_decode(r, path, o, policy, on_issue) for r, o in _lines(path, comp)), path, 0)
    return
  # 'blank': paragraphs separated by one or more blank lines.
  lines = ((_decode(raw, path, off, policy, on_issue), off) for raw, off in _lines(path, comp, span, blank=True))
  for text, group in itertools.groupby(lines, key=lambda pair: bool(pair[0].strip())):
    if text:
      group = list(group)
      yield Document(''.join(line for line, _ in group).rstrip('\r\n'), path, group[0][1])


def _line_error(path: str, comp: str, span: Span | None, line: int, detail: str) -> errors.DataError:
  """`path:LINE detail`, LINE counted from the file's first line also when only a part of it was read."""
  if span is not None and span.start > 0:
    # The parts before own the lines starting at or before `start`: the first, and one after each newline there.
    before, left = 1, span.start
    with _open_binary(path, comp) as f:
      while left > 0 and (block := f.read(min(left, 1 << 22))):
        before, left = before + block.count(b'\n'), left - len(block)
    line += before
  return errors.DataError(f'{path}:{line}{detail}')


def _jsonl_documents(path, comp, field, policy, on_issue, span):
  for lineno, (raw, off) in enumerate(_lines(path, comp, span), start=1):
    line = _decode(raw, path, off, policy, on_issue)
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise _line_error(path, comp, span, lineno, f' (byte {off}): not valid JSON ({e.msg})') from e
    if not isinstance(obj, dict) or field not in obj:
      have = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
      raise _line_error(path, comp, span, lineno, f': no field {field!r} (found {have}); choose one with --text-field')
    text = obj[field]
    if text is not None and not isinstance(text, str):
      raise _line_error(path, comp, span, lineno, f': field {field!r} is {type(text).__name__}, not text')
    yield Document(text or '', path, off)


def _parquet_documents(path, column, span):
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  with contextlib.ExitStack() as stack:
    # Local files by name: pyarrow reads them natively, faster than through a Python file object.
    source = stack.enter_context(open_file(path)) if paths.is_url(path) else path
    try:
      pf = pq.ParquetFile(source)
    except Exception as e:
      raise errors.DataError(f'{path}: not a readable Parquet file ({e})') from e
    names = pf.schema_arrow.names
    if column not in names:
      raise errors.DataError(f'{path}: no column {column!r} (columns: {names}); choose one with --text-field')
    groups = range(span.start, span.end) if span else None
    batches = pf.iter_batches(row_groups=groups, columns=[column], batch_size=4096)
    texts = (text for batch in batches for text in batch.column(0).to_pylist())
    for row, text in enumerate(texts, start=span.row if span else 0):
      if text is not None and not isinstance(text, str):
        raise errors.DataError(f'{path}: row {row}: column {column!r} is not a string column')
      yield Document(text or '', path, row)


def iter_documents(
  path: str,
  *,
  text_field: str = 'text',
  text_mode: str = 'line',
  on_decode_error: str = 'replace',
  on_issue: Callable[[DecodeIssue], None] = lambda _: None,
  span: Span | None = None,
) -> Iterator[Document]:
  """Documents of one file (or of its `span`), or of a Hugging Face dataset (hf.py), empty ones included."""
  if hf.is_input(path):
    if span is not None:
      raise ValueError(f'{path}: a Hugging Face dataset is read whole, not in spans')
    for row, text in hf.iter_texts(path, text_field):
      yield Document(text, path, row)
    return
  fmt, comp = split_ext(path)
  if text_mode not in TEXT_MODES:
    raise ValueError(f'text_mode must be one of {TEXT_MODES}, got {text_mode!r}')
  if on_decode_error not in ('replace', 'fail'):
    raise ValueError(f"on_decode_error must be 'replace' or 'fail', got {on_decode_error!r}")
  if fmt == 'text':
    if span is not None and text_mode == 'file':
      raise ValueError("text_mode 'file' reads whole files: a span would cut its one document")
    yield from _text_documents(path, comp, text_mode, on_decode_error, on_issue, span)
  elif fmt == 'jsonl':
    yield from _jsonl_documents(path, comp, text_field, on_decode_error, on_issue, span)
  elif fmt == 'parquet':
    if comp:
      raise errors.DataError(f'{path}: compress Parquet internally, not as a {comp} file')
    yield from _parquet_documents(path, text_field, span)
  else:
    raise errors.DataError(f'{path}: unknown file type (want .txt/.jsonl/.json/.parquet, optionally .gz/.zst)')
