"""A Hugging Face NeoBERT checkpoint -> a ready JAX model (reading is weights/hf.read_hf_dir's), and `save_flat`,
which decides where a flat-params file goes: an output ending in .safetensors is one file, anything else a
directory committed by its model_config.json; a gs:// output is written locally first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import ml_collections
import numpy as np
from flax import nnx

from neobert_jax import errors, paths
from neobert_jax.convert.export_hf import write_atomically
from neobert_jax.model import NeoBERTForMLM
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import hf, place


def load_hf_as_jax(path: str | os.PathLike, **kwargs) -> tuple[NeoBERTForMLM, ml_collections.ConfigDict]:
  """The JAX model (and its config) of an HF NeoBERT checkpoint, on the default device."""
  cfg, flat = hf.read_hf_dir(path, **kwargs)
  return place.model_from_flat(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)), flat), cfg


def save_flat(
  flat: dict[str, np.ndarray], cfg: ml_collections.ConfigDict, output: str | os.PathLike, *, overwrite: bool = False
) -> Path:
  """Writes flat params + model config: ``output`` ending in .safetensors is a file, anything else a directory."""
  flat_lib.check_flat(flat, cfg)
  remote = paths.is_url(output)
  output = paths.resolve(output, '--output') if remote else Path(output).expanduser().absolute()
  if not output.name.endswith('.safetensors'):
    return write_atomically(
      output, lambda tmp: flat_lib.write_flat_dir(flat, cfg, tmp), overwrite, marker=flat_lib.MODEL_CONFIG_FILE
    )
  if output.exists() and not overwrite:
    raise errors.ExportError(f'output file {output} exists; pass --overwrite to replace it')
  if remote:
    with tempfile.TemporaryDirectory(dir=paths.cache_dir('exports')) as tmp:
      flat_lib.write_flat_file(flat, cfg, os.path.join(tmp, output.name))
      paths.copy(paths.Path(os.path.join(tmp, output.name)), output)
    return output
  output.parent.mkdir(parents=True, exist_ok=True)
  tmp = output.with_name(f'.{output.name}.tmp-{os.getpid()}')
  try:
    flat_lib.write_flat_file(flat, cfg, tmp)
    os.replace(tmp, output)
  finally:
    tmp.unlink(missing_ok=True)
  return output
