"""Prepared-data layout on disk: ArrayRecord shards of token ids and manifest.json (formats v1 and v2: docs/data.md,
"Format"). Readers widen ids of `Manifest.id_dtype` to int32.

A prepared directory is complete only when manifest.json, written last, exists. Readers check every shard they use
against it (size, record count), so a damaged shard is an error before training starts, not a crash hours in; its
sha256, too slow to check on every open, is checked when a copy is made (data on a bucket).
"""

import dataclasses
import hashlib
import json
import os

from array_record.python.array_record_module import ArrayRecordWriter
import numpy as np

from neobert_jax import errors, paths
from neobert_jax.data import assets

MANIFEST = 'manifest.json'
FORMAT = 'neobert_jax.prepared/v2'  # what prepare writes
FORMAT_V1 = 'neobert_jax.prepared/v1'  # int32 ids, no id_dtype field: still read
FORMATS = (FORMAT_V1, FORMAT)
# The id widths a v2 manifest may name, little-endian whatever the machine.
ID_DTYPES = {'uint16': np.dtype('<u2'), 'int32': np.dtype('<i4')}
SPLITS = ('train', 'eval')
# group_size:1 makes every record its own chunk, so random access reads one document without decoding its
# neighbours; ids are left uncompressed because reading speed matters more than disk here.
WRITER_OPTIONS = 'group_size:1,uncompressed'


def shard_name(split: str, index: int) -> str:
  return f'{split}-{index:05d}.arrayrecord'


def fits(dtype: np.dtype, vocab_size: int) -> bool:
  """Whether ids of a `vocab_size`-id vocabulary fit `dtype`: uint16 holds vocabularies under 65,536 ids."""
  return vocab_size <= np.iinfo(dtype).max


def id_dtype_name(vocab_size: int) -> str:
  """The id width a v2 directory of this vocabulary stores: the narrowest that fits."""
  return 'uint16' if fits(ID_DTYPES['uint16'], vocab_size) else 'int32'


def decode(record: bytes, dtype: np.dtype) -> np.ndarray:
  """One record's ids, widened to int32."""
  return np.frombuffer(record, dtype).astype(np.int32)


def narrow(ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """`ids` as a contiguous array of `dtype`, checked: a cast alone would wrap an id that does not fit."""
  if ids.dtype != dtype and ids.size:
    lo, hi = int(ids.min()), int(ids.max())
    info = np.iinfo(dtype)
    if lo < info.min or hi > info.max:
      raise errors.DataError(
        f'token id {hi if hi > info.max else lo} does not fit {dtype.name}: the tokenizer made an id outside '
        'its vocabulary (vocab_size); check the tokenizer file'
      )
  return np.ascontiguousarray(ids, dtype=dtype)


class Rollover:
  """The running token count of the open shard of one split: the one rule where shards end that both `prepare`
  engines apply (ShardWriter after every document, the Ray driver on the documents' token counts, before any shard
  is written). A shard closes after the document that brings its ids (`id_bytes` each) to the target size, so a
  document is never cut."""

  def __init__(self, shard_bytes: int, id_bytes: int):
    self.target = max(1, -(-int(shard_bytes) // id_bytes))  # tokens * id_bytes >= shard_bytes
    self.tokens = 0

  def cuts(self, doc_tokens) -> list[int]:
    """For the next documents (their token counts, in order): the indices after which a shard closes."""
    sums = np.cumsum(np.asarray(doc_tokens, np.int64))
    out, base = [], 0
    while sums.size:
      at = int(np.searchsorted(sums, base + self.target - self.tokens, side='left'))
      if at >= sums.size:
        self.tokens += int(sums[-1]) - base
        break
      out.append(at)
      base, self.tokens = int(sums[at]), 0
    return out


def plan_shards(doc_tokens: list[np.ndarray], shard_bytes: int, id_bytes: int) -> list[list[tuple[int, int, int]]]:
  """The shards ShardWriter would make of a split from its documents' token counts per unit: (unit, first, end)s."""
  rule, plan, current = Rollover(shard_bytes, id_bytes), [], []
  for unit, tokens in enumerate(doc_tokens):
    first = 0
    for cut in rule.cuts(tokens):
      current.append((unit, first, cut + 1))
      plan.append(current)
      current, first = [], cut + 1
    if first < len(tokens):
      current.append((unit, first, len(tokens)))
  return plan + ([current] if current else [])


class ShardWriter:
  """Writes one split as numbered shards (from `first_index`) of `id_dtype` ids, rolling over at `shard_bytes`."""

  def __init__(self, directory: str, split: str, shard_bytes: int, *, id_dtype: str, first_index: int = 0):
    self._dir, self._split, self._first = directory, split, first_index
    self._dtype = ID_DTYPES[id_dtype]
    self._rollover = Rollover(shard_bytes, self._dtype.itemsize)
    self._writer = self._current = None
    self.shards: list[dict] = []
    self.records = self.tokens = self.documents = 0

  def write_document(self, chunks: list[np.ndarray]) -> None:
    """One document: its chunks land in one shard, in order."""
    if self._writer is None:
      name = shard_name(self._split, self._first + len(self.shards))
      self._writer = ArrayRecordWriter(os.path.join(self._dir, name), WRITER_OPTIONS)
      self._current = {'file': name, 'records': 0, 'tokens': 0}
    for c in chunks:
      self._writer.write(narrow(c, self._dtype).tobytes())
      self._current['records'] += 1
      self._current['tokens'] += int(c.size)
    tokens = sum(int(c.size) for c in chunks)
    self.records += len(chunks)
    self.tokens += tokens
    self.documents += 1
    if self._rollover.cuts([tokens]):
      self._close_current()

  def _close_current(self):
    if self._writer is not None:
      self._writer.close()
      path = os.path.join(self._dir, self._current['file'])
      self._current['bytes'] = os.path.getsize(path)
      self._current['sha256'] = paths.sha256(paths.Path(path))
      self.shards.append(self._current)
      self._writer = None

  def close(self) -> dict:
    self._close_current()
    return {'shards': self.shards, 'documents': self.documents, 'records': self.records, 'tokens': self.tokens}


def files_of(shard: dict) -> list[str]:
  """The files one manifest entry names: the shard, and the unread record index older prepared data lists with it."""
  return [shard['file']] + ([shard['index']['file']] if 'index' in shard else [])


def remedy(directory: str) -> str:
  """How to get whole prepared data back, for the end of every message about damaged data."""
  cache = os.path.abspath(assets.asset_cache_dir())
  if not paths.is_url(directory) and os.path.abspath(directory).startswith(os.path.join(cache, 'staged', '')):
    return f'delete {directory}: it is staged again from the bucket on first use'
  if not paths.is_url(directory) and os.path.abspath(directory).startswith(os.path.join(cache, '')):
    return f'delete {directory}: the built-in corpus is prepared again on first use'
  return (
    f'prepare it again (python -m neobert_jax.data.prepare --output {directory} --overwrite with the original inputs)'
  )


@dataclasses.dataclass(frozen=True)
class Manifest:
  """A prepared directory's manifest.json, checked when made (`read`, `parse`, `of`). `raw` is the JSON itself,
  written back byte for byte (`text`), so old directories read and write unchanged."""

  raw: dict = dataclasses.field(repr=False)

  @classmethod
  def read(cls, directory: str) -> 'Manifest':
    """The one reader: a local directory's manifest, or a bucket's (gs://); one DataError line naming the fix."""
    on_bucket = paths.is_url(directory)
    where = paths.resolve(directory, 'data.dir') if on_bucket else paths.Path(directory)
    try:
      raw = (where / MANIFEST).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):  # no manifest, or no directory
      bucket = paths.Path('/'.join(os.fspath(where).split('/')[:3]))
      if on_bucket and not bucket.exists():
        raise errors.StorageError(
          f'{where}: bucket {bucket} does not exist, or these credentials cannot see it'
        ) from None
      if not (where.exists() if on_bucket else os.path.isdir(directory)):
        raise errors.DataError(
          f'{where}: prepared-data directory does not exist (make it with '
          f'`python -m neobert_jax.data.prepare --output {where}`)'
        ) from None
      raise errors.DataError(
        f'{where}: no {MANIFEST}; the directory is not prepared data, or its prepare run did not finish: '
        f'{remedy(str(where))}'
      ) from None
    except Exception as e:  # noqa: BLE001 - gcsfs raises its own types for HTTP 401 / 403 / 5xx
      if not on_bucket:
        raise
      raise errors.StorageError(
        f'{where}/{MANIFEST} cannot be read ({errors.one_line(e)}); check that these credentials may read the bucket'
      ) from None
    return cls.parse(raw, directory)

  @classmethod
  def parse(cls, raw: bytes, directory: str) -> 'Manifest':
    """A manifest's bytes, checked; errors name `directory`/manifest.json (a local path or a bucket URL)."""
    try:
      manifest = json.loads(raw.decode('utf-8'))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise errors.DataError(
        f'{directory.rstrip("/")}/{MANIFEST}: unreadable manifest ({e}); {remedy(directory)}'
      ) from e
    return cls.of(manifest, directory)

  @classmethod
  def of(cls, manifest: dict, directory: str = '') -> 'Manifest':
    """`manifest` (decoded JSON, or what prepare builds) checked: format, the fields readers use, the id width."""
    path = f'{directory.rstrip("/")}/{MANIFEST}'
    if not isinstance(manifest, dict) or manifest.get('format') not in FORMATS:
      found = manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__
      raise errors.DataError(f'{path}: format {found!r}, expected {FORMAT!r} (or {FORMAT_V1!r}); {remedy(directory)}')
    _check_fields(path, manifest, directory)
    out = cls(manifest)
    try:
      dtype = out.id_dtype
    except errors.DataError as e:
      raise errors.DataError(f'{path}: damaged manifest ({e}); {remedy(directory)}') from None
    if not fits(dtype, out.vocab_size):  # a wrong width would decode every record into other ids
      raise errors.DataError(
        f'{path}: damaged manifest (id_dtype {manifest["id_dtype"]!r} cannot hold the ids of a {out.vocab_size}-id '
        f'vocabulary); {remedy(directory)}'
      )
    return out

  @property
  def tokenizer(self) -> dict:
    """The tokenizer's identity (tokenizer.Tokenizer.identity): kind, spec, vocab_size, special_ids, hashes."""
    return self.raw['tokenizer']

  spec = property(lambda self: self.tokenizer['spec'])
  vocab_size = property(lambda self: self.tokenizer['vocab_size'])
  special_ids = property(lambda self: self.tokenizer['special_ids'])
  max_length = property(lambda self: self.raw.get('max_length'))

  @property
  def id_dtype(self) -> np.dtype:
    """The width of the ids in the records: '<u2' or '<i4' (always '<i4' for v1)."""
    if self.raw.get('format') == FORMAT_V1:
      return ID_DTYPES['int32']
    name = self.raw.get('id_dtype')
    if not isinstance(name, str) or name not in ID_DTYPES:
      raise errors.DataError(f'id_dtype {name!r}: not one of {sorted(ID_DTYPES)}')
    return ID_DTYPES[name]

  def split(self, name: str) -> dict:
    """A split's entry (shards, documents, records, tokens); empty when the manifest has none."""
    return self.raw['splits'].get(name) or {'shards': []}

  def shards(self, split: str) -> list[dict]:
    return self.split(split)['shards']

  def records(self, split: str) -> int:
    return sum(s['records'] for s in self.shards(split))

  def files(self) -> list[str]:
    """Every file the manifest names, in its order: what copying, publishing or installing prepared data moves."""
    return [f for split in self.raw['splits'].values() for s in split['shards'] for f in files_of(s)]

  def text(self) -> str:
    """The manifest as written, locally and to a bucket alike (so the two are byte-identical)."""
    return json.dumps(self.raw, indent=1, sort_keys=True) + '\n'

  def version(self) -> str:
    """A short hash of the text: what names this data's copies in a cache."""
    return hashlib.sha256(self.text().encode()).hexdigest()[:12]

  def write(self, directory: paths.PathLike) -> None:
    """The one writer: atomically in a local directory, as one object on a bucket (a commit marker either way)."""
    paths.write_text(paths.Path(directory) / MANIFEST, self.text())


def _check_fields(path: str, manifest: dict, directory: str) -> None:
  """The fields readers index into: damage into other valid JSON is one error here, not a KeyError later."""
  try:
    ident, splits = manifest['tokenizer'], manifest['splits']
    counts = [ident['vocab_size'], ident['special_ids']['pad'], ident['special_ids']['mask']]
    for split in SPLITS:
      for shard in splits.get(split, {'shards': []})['shards']:
        counts += [shard['bytes'], shard['records']]
        if not isinstance(shard['file'], str):
          raise TypeError(f'shard file {shard["file"]!r}')
        if not isinstance(shard.get('sha256', ''), str):  # optional: older manifests lack it
          raise TypeError(f'shard sha256 {shard["sha256"]!r}')
        if 'index' in shard:  # older data's record index: not read, but copied with its shard (files_of)
          index = shard['index']
          counts.append(index['bytes'])
          if not isinstance(index['file'], str) or not isinstance(index['sha256'], str):
            raise TypeError(f'shard index {index!r}')
    bad = [c for c in counts if not isinstance(c, int)]
    if bad:
      raise TypeError(f'{bad[0]!r} where a number is expected')
  except (KeyError, TypeError, AttributeError) as e:
    raise errors.DataError(f'{path}: damaged manifest ({type(e).__name__}: {e}); {remedy(directory)}') from e
