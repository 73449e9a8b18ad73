"""A Hugging Face NeoBERT checkpoint -> a ready JAX model, and neobert-jax's own flat-params files.

Reading the checkpoint (a directory with config.json and model.safetensors, a sharded model.safetensors.index.json
or a pytorch_model.bin, or a .safetensors file with config.json beside it; the published chandar-lab/NeoBERT layout
``NeoBERTLMHead``: 'model.*' + 'decoder.*', or a base ``NeoBERT`` save, no prefix, no decoder, with
``init_missing_decoder``) is model/hf_layout.read_hf_dir, which the trainer's init.from_hf shares.

Saved flat params (``save_flat``) are a safetensors file whose keys are the flat keys
('encoder.layers.qkv', ...) and whose metadata 'neobert_jax.model_config' holds the model config as JSON; a
directory output holds that file as params.safetensors.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from neobert_jax import paths
from neobert_jax.convert.export_hf import write_atomically
from neobert_jax.model import NeoBERTForMLM, hf_layout, load_flat

CONFIG_METADATA_KEY = "neobert_jax.model_config"
FLAT_FILE_NAME = "params.safetensors"


def jax_model_from_flat(flat: dict[str, np.ndarray], cfg: ml_collections.ConfigDict) -> NeoBERTForMLM:
  """A NeoBERTForMLM holding ``flat`` on the default device, without spending time on a random init."""
  abstract = nnx.eval_shape(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  model = nnx.merge(graphdef, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), state))
  load_flat(model, flat)
  return model


def load_hf_as_jax(path: str | os.PathLike, **kwargs) -> tuple[NeoBERTForMLM, ml_collections.ConfigDict]:
  """The JAX model (and its config) of an HF NeoBERT checkpoint."""
  cfg, flat = hf_layout.read_hf_dir(path, **kwargs)
  return jax_model_from_flat(flat, cfg), cfg


def save_flat(flat: dict[str, np.ndarray], cfg: ml_collections.ConfigDict, output: str | os.PathLike, *,
              overwrite: bool = False) -> Path:
  """Writes flat params + model config: ``output`` ending in .safetensors is a file, anything else a directory."""
  hf_layout.check_flat(flat, cfg)
  arrays = {k: np.ascontiguousarray(v) for k, v in flat.items()}
  metadata = {CONFIG_METADATA_KEY: json.dumps(cfg.to_dict(), sort_keys=True)}
  # A gs:// output is written locally first: a single file is uploaded whole, a directory is committed by its
  # model_config.json, uploaded last (write_atomically).
  remote = paths.is_url(output)
  output = paths.resolve(output, "--output") if remote else Path(output).expanduser().absolute()
  if output.name.endswith(".safetensors"):
    if output.exists() and not overwrite:
      raise hf_layout.ConversionError(f"output file {output} exists; pass --overwrite to replace it")
    if remote:
      with tempfile.TemporaryDirectory(dir=paths.cache_dir("exports")) as tmp:
        save_file(arrays, os.path.join(tmp, output.name), metadata=metadata)
        paths.copy(paths.Path(os.path.join(tmp, output.name)), output)
      return output
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
      save_file(arrays, str(tmp), metadata=metadata)
      os.replace(tmp, output)
    finally:
      tmp.unlink(missing_ok=True)
    return output

  def fill(tmp: Path) -> None:
    save_file(arrays, str(tmp / FLAT_FILE_NAME), metadata=metadata)
    (tmp / "model_config.json").write_text(metadata[CONFIG_METADATA_KEY] + "\n")

  return write_atomically(output, fill, overwrite, marker="model_config.json")


def load_saved_flat(path: str | os.PathLike) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """Reads what save_flat wrote (file or directory): (model ConfigDict, flat params)."""
  path = Path(path).expanduser()
  file = path / FLAT_FILE_NAME if path.is_dir() else path
  if not file.is_file():
    raise hf_layout.ConversionError(f"{path}: no flat params file (expected a .safetensors or a dir with {FLAT_FILE_NAME})")
  metadata, flat = hf_layout.read_safetensors(file)
  if CONFIG_METADATA_KEY not in metadata:
    raise hf_layout.ConversionError(f"{file} lacks the '{CONFIG_METADATA_KEY}' metadata written by save_flat")
  cfg = ml_collections.ConfigDict(json.loads(metadata[CONFIG_METADATA_KEY]))
  hf_layout.check_flat(flat, cfg)
  return cfg, flat
