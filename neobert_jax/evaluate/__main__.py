"""Evaluate a NeoBERT: pseudo-perplexity on a text file, or its frozen embeddings on two benchmark tasks.

  python -m neobert_jax.evaluate {pppl,lee,bbc} --model=RUN_OR_HF_DIR ...   (the commands: _COMMANDS, or --help)

Every command prints one JSON line with its figures; --output also writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from neobert_jax import commandline, errors, paths

_COMMANDS = {
    'pppl': 'pseudo-perplexity of an MLM (pretraining run or Hugging Face NeoBERT directory) on a text file',
    'lee': 'Spearman correlation of embedding cosine similarity with the Lee human ratings (gensim test data)',
    'bbc': 'kNN topic accuracy on BBC News from frozen embeddings (5-fold, cosine, k=5)',
}


def _parser() -> commandline.Parser:
  p = commandline.Parser('evaluate', 'neobert_jax.evaluate', __doc__)
  sub = p.add_subparsers(dest='command', required=True)
  for name, text in _COMMANDS.items():
    s = sub.add_parser(name, help=text, doc=text)
    s.add_argument('--model', required=True, help='pretraining or fine-tuning workdir, or a Hugging Face NeoBERT dir')
    s.add_argument('--step', type=int, default=-1, help='checkpoint step of a workdir (-1 = latest / best)')
    s.add_argument('--tokenizer', default='', help="default: the model's own")
    s.add_argument('--max-length', type=int, default=512)
    s.add_argument('--batch-size', type=int, default=64)
    s.add_argument('--output', default='', help='also write the JSON result here')
    s.add_argument('--no-progress', action='store_true')
    if name == 'pppl':
      s.add_argument('--input', required=True, help='.txt (one text per line), CSV, TSV, JSONL or Parquet')
      s.add_argument('--text-field', default='text')
      s.add_argument('--per-document', default='', help='write one JSON line per document here')
    else:
      s.add_argument('--pooling', default='', choices=['', 'mean', 'cls'], help="default: the run's, else mean")
  return p


def pppl(args: argparse.Namespace) -> dict:
  from neobert_jax.evaluate import pppl as pppl_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.downstream import batching, tables  # pylint: disable=g-import-not-at-top
  from neobert_jax.finetune import state as state_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.weights import place, source as source_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.model import NeoBERTForMLM  # pylint: disable=g-import-not-at-top
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  src = source_lib.open_source(args.model, args.step, need_decoder=True)
  tok = source_lib.resolve_tokenizer(args.tokenizer, src)
  texts = tables.read_texts(args.input, args.text_field)
  seqs = batching.frame(tok, texts, None, args.max_length)
  mesh = state_lib.inference_mesh()
  batch = -(-args.batch_size // mesh.size) * mesh.size
  graphdef, params, shardings = place.sharded_params(lambda: NeoBERTForMLM(src.model_cfg, rngs=_rngs()), src.flat,
                                                      mesh)
  score = pppl_lib.jit_scorer(graphdef, shardings, mesh)
  bar = tqdm(total=sum(max(len(s) - 2, 0) for s in seqs), unit='tok', desc='pppl', disable=args.no_progress)
  result = pppl_lib.pseudo_perplexity(score, params, seqs, tok.mask_id, tok.pad_id, batch,
                                      batching.buckets(args.max_length), mesh, bar)
  bar.close()
  if args.per_document:
    paths.write_text(paths.resolve(args.per_document, '--per-document'),
                     ''.join(json.dumps(row) + '\n' for row in result.per_document))
  return {'pppl': result.pppl, 'nll': result.nll, 'tokens': result.tokens, 'documents': len(seqs)}


def _rngs():
  from flax import nnx  # pylint: disable=g-import-not-at-top
  return nnx.Rngs(0)


def embeddings_task(args: argparse.Namespace) -> dict:
  from neobert_jax import embed  # pylint: disable=g-import-not-at-top
  from neobert_jax.evaluate import datasets, embedding_tasks  # pylint: disable=g-import-not-at-top
  encoder = embed.Encoder.load(args.model, step=None if args.step < 0 else args.step, tokenizer=args.tokenizer,
                               pooling=args.pooling, max_length=args.max_length, batch_size=args.batch_size)
  progress = not args.no_progress
  if args.command == 'lee':
    docs, pairs, human = datasets.lee()
    return embedding_tasks.lee_spearman(encoder.encode(docs, progress=progress), pairs, human)
  texts, labels = datasets.bbc_articles()
  return embedding_tasks.knn_accuracy(encoder.encode(texts, progress=progress), np.asarray(labels))


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  try:
    with errors.reported('evaluate', args.debug):
      result = pppl(args) if args.command == 'pppl' else embeddings_task(args)
  except SystemExit as e:  # an expected error, already reported in one line
    return e.code
  line = json.dumps({'command': args.command, 'model': args.model, **result})
  print(line)
  if args.output:
    paths.write_text(paths.resolve(args.output, '--output'), line + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
