"""Train a SentencePiece vocabulary with BERT's special tokens ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4).

  python -m neobert_jax.data.prepare.train_sentencepiece --input 'corpus/*.jsonl' --output my_vocab --vocab-size 32000

Then `prepare --tokenizer my_vocab.model` and set the model's vocab_size to the printed size.
"""

from typing import Iterator, Sequence

from neobert_jax import commandline, errors
from neobert_jax.data.prepare import sources
from neobert_jax.data import tokenizer as tokenizer_lib


def _sentences(files, text_field, text_mode, limit_chars) -> Iterator[str]:
  """Non-empty lines of the documents: SentencePiece trains on sentence-sized units."""
  total = 0
  for path in files:
    for doc in sources.iter_documents(path, text_field=text_field, text_mode=text_mode):
      for line in doc.text.splitlines():
        line = line.strip()
        if line:
          yield line
          total += len(line)
          if total >= limit_chars:
            return


def train_tokenizer(
  inputs: Sequence[str],
  output_prefix: str,
  *,
  vocab_size: int = 32000,
  model_type: str = 'unigram',
  text_field: str = 'text',
  text_mode: str = 'line',
  character_coverage: float = 0.9995,
  max_chars: int = 2_000_000_000,
  seed_sentences: int = 1_000_000,
) -> tokenizer_lib.Tokenizer:
  """Trains `output_prefix`.model and returns it loaded as a Tokenizer."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  files = sources.expand_inputs(inputs)
  names = tokenizer_lib.BERT_SPECIAL_TOKENS
  spm.SentencePieceTrainer.train(
    sentence_iterator=_sentences(files, text_field, text_mode, max_chars),
    model_prefix=output_prefix,
    vocab_size=vocab_size,
    model_type=model_type,
    character_coverage=character_coverage,
    # BERT layout: [PAD] must be 0 because the model and masks treat id 0 as padding.
    pad_id=0,
    unk_id=1,
    bos_id=2,
    eos_id=3,
    pad_piece=names['pad'],
    unk_piece=names['unk'],
    bos_piece=names['cls'],
    eos_piece=names['sep'],
    user_defined_symbols=[names['mask']],
    input_sentence_size=seed_sentences,
    shuffle_input_sentence=True,
    # Long lines are real documents here, not noise.
    max_sentence_length=1 << 16,
    minloglevel=2,
  )
  tok = tokenizer_lib.load_tokenizer(output_prefix + '.model')
  want = {'pad': 0, 'unk': 1, 'cls': 2, 'sep': 3, 'mask': 4}
  if tok.special != want:
    raise RuntimeError(f'unexpected special ids {tok.special}, wanted {want}')
  return tok


def main(argv=None):
  p = commandline.Parser('train_sentencepiece', 'neobert_jax.data.prepare.train_sentencepiece', __doc__)
  p.add_argument('--input', nargs='+', required=True, action='extend', help='files, globs or directories, as prepare')
  p.add_argument('--output', required=True, help='prefix: writes PREFIX.model, PREFIX.vocab')
  p.add_argument('--vocab-size', type=int, default=32000)
  p.add_argument('--model-type', default='unigram', choices=('unigram', 'bpe'))
  p.add_argument('--text-field', default='text')
  p.add_argument('--text-mode', default='line', choices=sources.TEXT_MODES)
  p.add_argument('--character-coverage', type=float, default=0.9995)
  p.add_argument(
    '--sentences', type=int, default=1_000_000, help='lines sampled for training (SentencePiece input_sentence_size)'
  )
  a = p.parse_args(argv)
  with errors.reported('train_sentencepiece', a.debug):
    same = ('vocab_size', 'model_type', 'text_field', 'text_mode', 'character_coverage')
    tok = train_tokenizer(a.input, a.output, **{f: getattr(a, f) for f in same}, seed_sentences=a.sentences)
  print(f'{a.output}.model: {tok.vocab_size} ids, specials {tok.special}')
  return tok


if __name__ == '__main__':
  main()
