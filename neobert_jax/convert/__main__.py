"""Convert between neobert-jax checkpoints and Hugging Face NeoBERT directories.

Commands: to-pytorch, from-pytorch and to-onnx (docs/export.md; --help lists each one's flags). Errors exit with
status 1 and one line naming the problem and the fix; --debug shows the traceback instead.
"""

from __future__ import annotations

import sys

from neobert_jax import commandline, errors
from neobert_jax.convert import export_hf
from neobert_jax.jobs import convert as convert_job


def _job(job, *positional: str):
  """Runs `job` with the flags named in `positional` first and every other flag by its name."""

  def run(args):
    options = {k: v for k, v in vars(args).items() if k not in ('command', 'debug', 'run', *positional)}
    return job(*(getattr(args, name) for name in positional), **options)

  return run


def build_parser() -> commandline.Parser:
  parser = commandline.Parser('convert', 'neobert_jax.convert', __doc__)
  sub = parser.add_subparsers(dest='command', required=True)

  help_text = 'training checkpoint -> Hugging Face directory (model.py + safetensors)'
  exp = sub.add_parser('to-pytorch', help=help_text, doc=help_text)
  exp.add_argument(
    '--checkpoint', required=True, help='training workdir, its checkpoints/ dir, or flat params written by from-pytorch'
  )
  exp.add_argument('--step', type=int, default=None, help='checkpoint step (default: latest complete)')
  exp.add_argument('--output', required=True, help='directory to create')
  exp.add_argument(
    '--tokenizer',
    default=None,
    help="'bert-base-uncased', a tokenizer dir, tokenizer.json or vocab.txt "
    "(default: the training config's data.tokenizer, if set)",
  )
  exp.add_argument('--dtype', default='float32', choices=sorted(export_hf.EXPORT_DTYPES))
  exp.add_argument(
    '--model-type',
    default='neobert',
    choices=export_hf.MODEL_TYPES,
    help="neobert: model.py with remote code (transformers 4.57 and 5.x, to-onnx); eurobert: transformers' own "
    'EuroBert classes, no remote code (transformers 5.3 and later)',
  )
  exp.add_argument(
    '--use-ema',
    action='store_true',
    help='export the moving average of the weights the run kept (train.ema_decay > 0) instead of the weights',
  )
  exp.add_argument('--overwrite', action='store_true', help='replace a non-empty output directory')
  exp.set_defaults(run=_job(convert_job.to_pytorch, 'checkpoint', 'output'))

  help_text = 'Hugging Face NeoBERT -> flat params (+ model config) for JAX'
  imp = sub.add_parser('from-pytorch', help=help_text, doc=help_text)
  imp.add_argument('--input', required=True, help='HF directory (config.json + weights) or a .safetensors file')
  imp.add_argument('--output', required=True, help='FILE.safetensors, or a directory (gets params.safetensors)')
  imp.add_argument(
    '--init-missing-decoder',
    action='store_true',
    help='the input is a base NeoBERT without MLM head: create a fresh decoder',
  )
  imp.add_argument('--overwrite', action='store_true', help='replace an existing output')
  imp.set_defaults(run=_job(convert_job.from_pytorch, 'input', 'output'))

  help_text = 'Hugging Face or sentence-transformers NeoBERT directory -> ONNX directory (onnxruntime, transformers.js)'
  onx = sub.add_parser('to-onnx', help=help_text, doc=help_text)
  onx.add_argument('--input', required=True, help='directory written by to-pytorch or by the fine-tuning export')
  onx.add_argument(
    '--output',
    required=True,
    help='directory to create (onnx/model.onnx, onnx/model_quantized.onnx, config.json, tokenizer)',
  )
  onx.add_argument(
    '--task',
    default=None,
    choices=['mlm', 'embedding', 'hidden'],
    help='logits (fill-mask), last_hidden_state and sentence_embedding, or last_hidden_state (feature-extraction) '
    '(default: embedding for a sentence-transformers directory, else mlm)',
  )
  onx.add_argument(
    '--opset',
    type=int,
    default=None,
    help="ONNX opset: 23 (the default) uses ONNX's Attention op; 18 only basic ops, for runtimes without it",
  )
  onx.add_argument('--overwrite', action='store_true', help='replace a non-empty output directory')
  onx.set_defaults(run=_job(convert_job.to_onnx, 'input', 'output'))
  return parser


def main(argv: list[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  try:
    with errors.reported('convert', args.debug):
      print(args.run(args))
  except SystemExit as e:
    return e.code
  return 0


if __name__ == '__main__':
  sys.exit(main())
