"""Documents -> records, shared by both engines: units of text, tokenizing, cutting long documents, the held-out
split, the counts and the manifest. Sharing these and the writer is why both engines make the same bytes."""

import dataclasses
import hashlib
import sys
from typing import Any, Iterable, Iterator

import numpy as np

from neobert_jax import errors
from neobert_jax.data import shards
from neobert_jax.data.prepare import sources
from neobert_jax.data import tokenizer as tokenizer_lib

UNIT_CHARS = 1 << 20  # ~1 MB of text per tokenizer call: big enough to hide IPC costs
UNIT_DOCS = 1024
MAX_REPORTED_ISSUES = 100


@dataclasses.dataclass(frozen=True)
class BuildOptions:
  """What a prepare makes, whichever engine runs it; checked when made."""

  tokenizer: str = tokenizer_lib.BUILTIN_BERT  # 'bert-base-uncased', vocab.txt, tokenizer.json or SentencePiece .model
  max_length: int = 1024  # ids per record, [CLS] and [SEP] included
  eval_fraction: float = 0.01  # share of documents held out for evaluation
  text_field: str = 'text'  # JSONL field / Parquet column
  text_mode: str = 'line'  # plain text: a document per line, per blank-line block or per file (sources.TEXT_MODES)
  on_decode_error: str = 'replace'  # or 'fail'
  shard_mb: float = 256.0  # target shard size
  overwrite: bool = False  # replace an existing output
  progress: bool = False  # a progress bar on stderr
  command: str | None = None  # recorded in the manifest (default: the call)

  def __post_init__(self):
    if self.max_length < 3:
      raise errors.ConfigError(f'--max-length={self.max_length}: must be at least 3 ([CLS], a token, [SEP])')
    if not 0 <= self.eval_fraction < 1:  # NaN fails too
      raise errors.ConfigError(
        f'--eval-fraction={self.eval_fraction}: must be a share of the documents in [0, 1), e.g. 0.01'
      )
    if not 0 < self.shard_mb < float('inf'):
      raise errors.ConfigError(f'--shard-mb={self.shard_mb}: must be a positive number of megabytes, e.g. 256')
    if not self.text_field:
      raise errors.ConfigError('--text-field is empty: name the JSONL field or Parquet column, e.g. text')

  @classmethod
  def of(cls, options: 'BuildOptions | None', fields: dict[str, Any]) -> 'BuildOptions':
    return dataclasses.replace(options or cls(), **fields)

  @property
  def shard_bytes(self) -> int:
    return int(self.shard_mb * 2**20)

  def record_fields(self) -> dict[str, Any]:
    """The options that decide each document's records and split (a Ray build's identity, kept by its ledger)."""
    return {f: getattr(self, f) for f in ('max_length', 'eval_fraction', 'text_field', 'text_mode', 'on_decode_error')}


def chunk_document(ids: np.ndarray, max_length: int, cls_id: int, sep_id: int) -> list[np.ndarray]:
  body = max_length - 2
  return [np.r_[cls_id, ids[s : s + body], sep_id].astype(np.int32) for s in range(0, max(len(ids), 1), body)]


def is_eval_document(text: str, eval_fraction: float) -> bool:
  if eval_fraction <= 0:
    return False
  h = int.from_bytes(hashlib.blake2b(text.encode('utf-8'), digest_size=8).digest(), 'little')
  return h / 2.0**64 < eval_fraction


def tokenize_texts(tok, texts: list[str], max_length: int, eval_fraction: float) -> list:
  """Per text: None (no tokens: e.g. only control characters, nothing to learn from) or (held out, records)."""
  out = []
  for text, ids in zip(texts, tok.encode_batch(texts)):
    if ids.size == 0:
      out.append(None)
    else:
      out.append((is_eval_document(text, eval_fraction), chunk_document(ids, max_length, tok.cls_id, tok.sep_id)))
  return out


class Counts:
  """What the manifest reports about the input (summed over units with `add` on the Ray engine)."""

  FIELDS = ('input_documents', 'skipped_empty', 'split_documents', 'issue_count')

  def __init__(self, echo: bool = True):
    self.echo = echo  # print each decode issue as it is found (a Ray task returns them to the driver instead)
    self.input_documents = self.skipped_empty = self.split_documents = self.issue_count = 0
    self.issues: list[str] = []

  def on_issue(self, issue) -> None:
    self.issue_count += 1
    if len(self.issues) < MAX_REPORTED_ISSUES:
      self.issues.append(str(issue))
    if self.echo:
      print(f'warning: {issue}; replaced with U+FFFD', file=sys.stderr)

  def take(self, results: list) -> Iterator[tuple[str, list[np.ndarray]]]:
    """(split, records) of each tokenized document of `results` (tokenize_texts), counting the others."""
    for res in results:
      if res is None:
        self.skipped_empty += 1
        continue
      held_out, chunks = res
      self.split_documents += len(chunks) > 1
      yield ('eval' if held_out else 'train'), chunks

  def as_dict(self) -> dict:
    return {**{f: getattr(self, f) for f in self.FIELDS}, 'issues': self.issues}

  def add(self, counts: dict) -> None:
    for f in self.FIELDS:
      setattr(self, f, getattr(self, f) + counts[f])
    self.issues += counts['issues'][: MAX_REPORTED_ISSUES - len(self.issues)]


def text_units(
  units: Iterable[tuple[str, sources.Span | None]], counts: Counts, o: BuildOptions
) -> Iterator[list[str]]:
  """Non-empty document texts of the units (file, part or None), grouped for the tokenizer, in order."""
  texts, size = [], 0
  for path, span in units:
    read = dict(text_field=o.text_field, text_mode=o.text_mode, on_decode_error=o.on_decode_error, span=span)
    for doc in sources.iter_documents(path, on_issue=counts.on_issue, **read):
      counts.input_documents += 1
      if not doc.text.strip():
        counts.skipped_empty += 1
        continue
      texts.append(doc.text)
      size += len(doc.text)
      if size >= UNIT_CHARS or len(texts) >= UNIT_DOCS:
        yield texts
        texts, size = [], 0
  if texts:
    yield texts


def progress_bar(enabled: bool, **kw):
  """Both engines' progress bar on stderr (a silent one unless `enabled`)."""
  import tqdm  # pylint: disable=g-import-not-at-top

  return tqdm.tqdm(mininterval=1.0, disable=not enabled, **kw)


def manifest(tok, o: BuildOptions, splits: dict, files: list[str], counts: Counts, call: str) -> dict:
  """The manifest's fields that depend only on what was prepared (each engine adds its own; `call` is the command
  recorded when `o` names none); refuses no text."""
  if splits['train']['documents'] == 0:
    raise errors.DataError(
      f'no documents with text in {len(files)} file(s) ({counts.input_documents} read, '
      f'{counts.skipped_empty} empty); the corpus is empty'
    )
  return {
    'format': shards.FORMAT,
    'id_dtype': shards.id_dtype_name(tok.vocab_size),
    'tokenizer': tok.identity(),
    'max_length': o.max_length,
    'eval_fraction': o.eval_fraction,
    'splits': splits,
    'input_files': files,
    'input_documents': counts.input_documents,
    'skipped_empty_documents': counts.skipped_empty,
    'split_long_documents': counts.split_documents,
    'decode_errors': {'count': counts.issue_count, 'first': counts.issues},
    'command': o.command or call,
  }
