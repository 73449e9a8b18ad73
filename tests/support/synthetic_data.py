"""Small synthetic vocabularies and prepared datasets for tests and benchmarks.

Pipeline tests do not need real text: documents whose second id names the
document (id FIRST_DOC_ID + i) make disjointness and "nothing lost" checks exact.
"""

import os
import string

import numpy as np

from neobert_jax.data import shards

SPECIAL = {'pad': 0, 'unk': 1, 'cls': 2, 'sep': 3, 'mask': 4}
FIRST_DOC_ID = 100


def write_wordpiece_vocab(path: str, words=()) -> str:
  """A tiny lower-case WordPiece vocab.txt: BERT specials, characters, a few words."""
  chars = list(string.ascii_lowercase + string.digits + string.punctuation)
  pieces = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + chars + ['##' + c for c in chars]
  pieces += [w for w in words if w not in pieces]
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(pieces) + '\n')
  return path


def synthetic_documents(
  n: int, seed: int = 0, min_len: int = 3, max_len: int = 300, vocab_size: int = 30522
) -> list[np.ndarray]:
  """[CLS] doc-id body... [SEP]; body ids avoid the specials and the doc-id range."""
  rng = np.random.default_rng(seed)
  lo = FIRST_DOC_ID + n
  docs = []
  for i in range(n):
    length = int(rng.integers(min_len, max_len + 1))
    d = rng.integers(lo, vocab_size, length).astype(np.int32)
    d[0], d[1], d[-1] = SPECIAL['cls'], FIRST_DOC_ID + i, SPECIAL['sep']
    docs.append(d)
  return docs


def write_prepared(
  directory: str,
  train_docs,
  eval_docs=(),
  *,
  vocab_size: int = 30522,
  max_length: int = 1024,
  shard_bytes: int = 1 << 30,
  tokenizer_identity: dict | None = None,
  version: int = 2,
) -> dict:
  """Writes shards + manifest as `prepare` would, from id arrays (no tokenizing): format v2 (ids as narrow as the
  vocabulary allows), or v1 (int32 ids, what `prepare` wrote before v2) with version=1."""
  if version not in (1, 2):
    raise ValueError(f'version {version}: 1 or 2')
  ident = tokenizer_identity or {
    'kind': 'synthetic',
    'spec': 'synthetic',
    'vocab_size': vocab_size,
    'special_ids': dict(SPECIAL),
    'vocab_sha256': 'synthetic',
    'file_sha256': 'synthetic',
  }
  width = shards.id_dtype_name(ident['vocab_size']) if version == 2 else 'int32'
  os.makedirs(directory, exist_ok=True)
  splits = {}
  for split, docs in (('train', train_docs), ('eval', eval_docs)):
    w = shards.ShardWriter(directory, split, shard_bytes, id_dtype=width)
    for d in docs:
      w.write_document([np.asarray(d, np.int32)])
    splits[split] = w.close()
  manifest = {
    'format': shards.FORMAT if version == 2 else shards.FORMAT_V1,
    **({'id_dtype': width} if version == 2 else {}),
    'tokenizer': ident,
    'max_length': max_length,
    'eval_fraction': 0.0,
    'splits': splits,
    'command': 'synthetic_data.write_prepared',
  }
  shards.Manifest.of(manifest, directory).write(directory)
  return manifest


def original_ids(batch: dict) -> np.ndarray:
  """Undo masking: the ids before [MASK]/random replacement."""
  return np.where(batch['labels'] >= 0, batch['labels'], batch['input_ids'])


def documents_in(batch: dict) -> list[int]:
  """Doc numbers of synthetic documents that start in this batch (their [CLS] row)."""
  ids = original_ids(batch)
  starts = (batch['positions'] == 1) & (batch['segment_ids'] > 0)
  return sorted(int(x) - FIRST_DOC_ID for x in ids[starts])
