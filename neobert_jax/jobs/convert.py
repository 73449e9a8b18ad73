"""The conversion jobs of `python -m neobert_jax.convert to-pytorch | from-pytorch | to-onnx`: each returns the line
the command prints; errors are the package's typed errors (errors.py), which the command reports in one line."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import ml_collections
import numpy as np

from neobert_jax import errors, paths
from neobert_jax.convert import export_hf
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import hf


def _missing_input_is_an_export_error(job):
  """A missing input is the user's to fix like any other conversion error: the same one line, the same status."""

  @functools.wraps(job)
  def run(*args, **kwargs):
    try:
      return job(*args, **kwargs)
    except FileNotFoundError as e:
      raise errors.ExportError(errors.one_line(e)) from e

  return run


@_missing_input_is_an_export_error
def to_pytorch(
  checkpoint: str,
  output: str,
  *,
  step: int | None = None,
  tokenizer: str | None = None,
  dtype: str = 'float32',
  model_type: str = 'neobert',
  use_ema: bool = False,
  overwrite: bool = False,
) -> str:
  """A training workdir, its checkpoints/ or a params file written by from_pytorch -> a Hugging Face directory."""
  export_hf.check_output_dir(output, overwrite)  # before reading a possibly large checkpoint
  source = paths.resolve(checkpoint, '--checkpoint')
  options = dict(tokenizer=tokenizer, dtype=dtype, model_type=model_type, overwrite=overwrite)
  if flat_lib.is_flat_file(source):
    if step is not None or use_ema:
      raise errors.ExportError(f'--step and --use-ema apply to training checkpoints, not to the params file {source}')
    cfg, flat = flat_lib.load_saved_flat(paths.local_copy(source))
    out = export_hf.export_flat(flat, cfg, output, **options)
  else:
    out = export_hf.export_checkpoint(source, output, step=step, use_ema=use_ema, **options)
  files = ', '.join(sorted(p.name for p in out.iterdir()))
  kind = 'EuroBERT (no remote code, transformers >= 5.3)' if model_type == 'eurobert' else 'NeoBERT'
  return f'wrote Hugging Face {kind} to {out} ({files})'


def save_flat(
  flat: dict[str, np.ndarray], cfg: ml_collections.ConfigDict, output: str | os.PathLike, *, overwrite: bool = False
) -> Path:
  """Writes flat params + model config: ``output`` ending in .safetensors is a file, anything else a directory."""
  flat_lib.check_flat(flat, cfg)
  remote = paths.is_url(output)
  output = paths.resolve(output, '--output') if remote else Path(output).expanduser().absolute()
  if not output.name.endswith('.safetensors'):
    return export_hf.write_atomically(
      output, lambda tmp: flat_lib.write_flat_dir(flat, cfg, tmp), overwrite, marker=flat_lib.MODEL_CONFIG_FILE
    )
  if output.exists() and not overwrite:
    raise errors.ExportError(f'output file {output} exists; pass --overwrite to replace it')
  if not remote:
    output.parent.mkdir(parents=True, exist_ok=True)
  # Written whole beside the output (or in the cache, for a bucket), then moved or uploaded: all or nothing.
  with tempfile.TemporaryDirectory(prefix='.tmp-', dir=paths.cache_dir('exports') if remote else output.parent) as tmp:
    flat_lib.write_flat_file(flat, cfg, os.path.join(tmp, output.name))
    if remote:
      paths.copy(paths.Path(os.path.join(tmp, output.name)), output)
    else:
      os.replace(os.path.join(tmp, output.name), output)
  return output


@_missing_input_is_an_export_error
def from_pytorch(source: str, output: str, *, init_missing_decoder: bool = False, overwrite: bool = False) -> str:
  """A Hugging Face NeoBERT (directory or .safetensors, local or on a bucket) -> flat parameters for JAX."""
  local = source if not paths.is_url(source) else paths.local_copy(source, marker='config.json')
  cfg, flat = hf.read_hf_dir(local, init_missing_decoder=init_missing_decoder)
  out = save_flat(flat, cfg, output, overwrite=overwrite)
  n = sum(v.size for v in flat.values())
  return f'wrote {len(flat)} arrays ({n / 1e6:.1f}M parameters, {cfg.num_layers} layers x {cfg.hidden_size}) to {out}'


@_missing_input_is_an_export_error
def to_onnx(source: str, output: str, *, task: str | None = None, opset: int | None = None, overwrite=False) -> str:
  """A Hugging Face or sentence-transformers NeoBERT directory -> an ONNX directory (onnxruntime, transformers.js)."""
  from neobert_jax.convert import onnx_export  # torch and onnxscript: only this job needs them

  directory = paths.resolve(source, '--input')
  if not directory.is_dir():
    raise errors.ExportError(f'--input {source}: no such directory (give a Hugging Face NeoBERT directory)')
  out = onnx_export.export_onnx(
    directory, output, task=task, opset=opset or onnx_export.DEFAULT_OPSET, overwrite=overwrite
  )
  written = json.loads((out / 'config.json').read_text())['onnx_task']
  return (
    f'wrote the ONNX graphs ({written}) to {out}: {onnx_export.ONNX_NAME} (float32) and '
    f'{onnx_export.QUANTIZED_NAME} (int8 weights), with config.json and the tokenizer. Load with\n'
    + onnx_export.usage(out, written)
  )
