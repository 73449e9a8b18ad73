"""Convert between neobert-jax checkpoints and Hugging Face NeoBERT directories.

  python -m neobert_jax.convert to-pytorch --checkpoint RUN_OR_CKPT_DIR [--step N] --output DIR \
      [--tokenizer bert-base-uncased|DIR|tokenizer.json|vocab.txt] [--dtype float32|bfloat16] \
      [--model-type neobert|eurobert] [--overwrite]
  python -m neobert_jax.convert from-pytorch --input HF_DIR_OR_SAFETENSORS --output FILE.safetensors|DIR \
      [--init-missing-decoder] [--overwrite]
  python -m neobert_jax.convert to-onnx --input HF_OR_SENTENCE_TRANSFORMERS_DIR --output DIR \
      [--task mlm|embedding|hidden] [--opset 23] [--overwrite]

--checkpoint also accepts what from-pytorch wrote (a .safetensors file or its directory). Errors (missing key, wrong
shape, config mismatch, existing output) exit with status 1 and one line naming the problem and the fix;
--debug shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from neobert_jax import commandline, errors, paths
from neobert_jax.convert import export_hf, import_hf
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import hf


def to_pytorch(args: argparse.Namespace) -> str:
  export_hf.check_output_dir(args.output, args.overwrite)  # before reading a possibly large checkpoint
  source = paths.resolve(args.checkpoint, '--checkpoint')
  options = dict(tokenizer=args.tokenizer, dtype=args.dtype, model_type=args.model_type, overwrite=args.overwrite)
  if flat_lib.is_flat_file(source):
    if args.step is not None or args.use_ema:
      raise errors.ExportError(f'--step and --use-ema apply to training checkpoints, not to the params file {source}')
    cfg, flat = flat_lib.load_saved_flat(paths.local_copy(source))
    out = export_hf.export_flat(flat, cfg, args.output, **options)
  else:
    out = export_hf.export_checkpoint(source, args.output, step=args.step, use_ema=args.use_ema, **options)
  files = ', '.join(sorted(p.name for p in out.iterdir()))
  kind = 'EuroBERT (no remote code, transformers >= 5.3)' if args.model_type == 'eurobert' else 'NeoBERT'
  return f'wrote Hugging Face {kind} to {out} ({files})'


def from_pytorch(args: argparse.Namespace) -> str:
  source = args.input if not paths.is_url(args.input) else paths.local_copy(args.input, marker='config.json')
  cfg, flat = hf.read_hf_dir(source, init_missing_decoder=args.init_missing_decoder)
  out = import_hf.save_flat(flat, cfg, args.output, overwrite=args.overwrite)
  count = sum(v.size for v in flat.values())
  return (
    f'wrote {len(flat)} arrays ({count / 1e6:.1f}M parameters, {cfg.num_layers} layers x {cfg.hidden_size}) to {out}'
  )


def to_onnx(args: argparse.Namespace) -> str:
  from neobert_jax.convert import onnx_export  # torch and onnxscript: only this subcommand needs them

  source = paths.resolve(args.input, '--input')
  if not source.is_dir():
    raise errors.ExportError(f'--input {args.input}: no such directory (give a Hugging Face NeoBERT directory)')
  opset = args.opset or onnx_export.DEFAULT_OPSET
  out = onnx_export.export_onnx(source, args.output, task=args.task, opset=opset, overwrite=args.overwrite)
  task = json.loads((out / 'config.json').read_text())['onnx_task']
  return (
    f'wrote the ONNX graphs ({task}) to {out}: {onnx_export.ONNX_NAME} (float32) and {onnx_export.QUANTIZED_NAME} '
    f'(int8 weights), with config.json and the tokenizer. Load with\n' + onnx_export.usage(out, task)
  )


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
  exp.set_defaults(run=to_pytorch)

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
  imp.set_defaults(run=from_pytorch)

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
  onx.set_defaults(run=to_onnx)
  return parser


def main(argv: list[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  try:
    # A missing input is the user's to fix like any other conversion error: same line, same status.
    with errors.reported('convert', args.debug, also={FileNotFoundError: errors.ExportError}):
      print(args.run(args))
  except SystemExit as e:
    return e.code
  return 0


if __name__ == '__main__':
  sys.exit(main())
