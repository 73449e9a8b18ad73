"""A Hugging Face NeoBERT checkpoint -> neobert-jax model config + flat params (and a ready JAX model).

Sources: a directory with config.json and model.safetensors (or a sharded model.safetensors.index.json, or a
pytorch_model.bin, which needs torch), or a .safetensors file with config.json beside it. The published
chandar-lab/NeoBERT layout (``NeoBERTLMHead``: 'model.*' + 'decoder.*') and a base ``NeoBERT`` save (no prefix, no
decoder; needs ``init_missing_decoder``) are accepted.

Saved flat params (``save_flat``) are a safetensors file whose keys are the flat keys
('encoder.layers.qkv', ...) and whose metadata 'neobert_jax.model_config' holds the model config as JSON; a
directory output holds that file as params.safetensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from neobert_jax.convert import mapping
from neobert_jax.convert.export_hf import write_atomically
from neobert_jax.model import NeoBERTForMLM, load_flat

CONFIG_METADATA_KEY = "neobert_jax.model_config"
FLAT_FILE_NAME = "params.safetensors"


def _read_safetensors(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
  """(metadata, arrays) of a safetensors file; ConversionError if it is not one."""
  try:
    with safe_open(str(path), framework="np") as fh:
      return fh.metadata() or {}, {key: fh.get_tensor(key) for key in fh.keys()}
  except Exception as e:  # safetensors raises its own error types for truncated or foreign files
    raise mapping.ConversionError(f"{path} is not a readable safetensors file ({type(e).__name__}: {e})") from e


def read_hf_state_dict(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json as a dict, state_dict as numpy arrays) of an HF directory or .safetensors file."""
  path = Path(path).expanduser()
  if not path.exists():
    raise mapping.ConversionError(f"--input {path}: no such file or directory")
  folder = path if path.is_dir() else path.parent
  config_path = folder / "config.json"
  if not config_path.is_file():
    raise mapping.ConversionError(
        f"{folder} has no config.json; fix: put the checkpoint's config.json next to its weights")
  hf_config = json.loads(config_path.read_text())
  if path.is_file():
    if path.suffix != ".safetensors":
      raise mapping.ConversionError(f"--input {path}: expected a directory or a .safetensors file")
    return hf_config, _read_safetensors(path)[1]
  if (folder / "model.safetensors").is_file():
    return hf_config, _read_safetensors(folder / "model.safetensors")[1]
  index = folder / "model.safetensors.index.json"
  if index.is_file():
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    state = {}
    for shard in shards:
      state.update(_read_safetensors(folder / shard)[1])
    return hf_config, state
  if (folder / "pytorch_model.bin").is_file():
    import torch  # only this legacy format needs torch
    from neobert_jax.convert.torch_ref import torch_to_numpy
    state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    return hf_config, {k: torch_to_numpy(v) for k, v in state.items()}
  raise mapping.ConversionError(
      f"{folder} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def read_hf_dir(path: str | os.PathLike, *, init_missing_decoder: bool = False,
            seed: int = 0) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """(model ConfigDict, flat params) of an HF NeoBERT checkpoint; raises ConversionError on any mismatch.

  ``init_missing_decoder``: a base-model save has no MLM decoder; create one (U(-r, r) kernel, zero bias).
  """
  hf_config, state = read_hf_state_dict(path)
  cfg = mapping.model_config_from_hf(hf_config)
  state = mapping.normalize_hf_state_dict(state)
  if init_missing_decoder and "decoder.weight" not in state and "decoder.bias" not in state:
    rng = np.random.default_rng(seed)
    limit = cfg.decoder_init_range
    dtype = state["model.encoder.weight"].dtype if "model.encoder.weight" in state else np.float32
    state["decoder.weight"] = rng.uniform(-limit, limit, (cfg.vocab_size, cfg.hidden_size)).astype(dtype)
    state["decoder.bias"] = np.zeros((cfg.vocab_size,), dtype)
  try:
    return cfg, mapping.hf_state_dict_to_flat(state, cfg)
  except mapping.ConversionError as e:
    if "decoder.weight" in str(e) and "decoder.weight" not in state:
      raise mapping.ConversionError(
          f"{e}\nThis looks like a base NeoBERT save without the MLM head: pass --init-missing-decoder "
          "(init_missing_decoder=True) to create a fresh decoder") from e
    raise


def jax_model_from_flat(flat: dict[str, np.ndarray], cfg: ml_collections.ConfigDict) -> NeoBERTForMLM:
  """A NeoBERTForMLM holding ``flat`` on the default device, without spending time on a random init."""
  abstract = nnx.eval_shape(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  model = nnx.merge(graphdef, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), state))
  load_flat(model, flat)
  return model


def load_hf_as_jax(path: str | os.PathLike, **kwargs) -> tuple[NeoBERTForMLM, ml_collections.ConfigDict]:
  """The JAX model (and its config) of an HF NeoBERT checkpoint."""
  cfg, flat = read_hf_dir(path, **kwargs)
  return jax_model_from_flat(flat, cfg), cfg


def save_flat(flat: dict[str, np.ndarray], cfg: ml_collections.ConfigDict, output: str | os.PathLike, *,
              overwrite: bool = False) -> Path:
  """Writes flat params + model config: ``output`` ending in .safetensors is a file, anything else a directory."""
  mapping.check_flat(flat, cfg)
  arrays = {k: np.ascontiguousarray(v) for k, v in flat.items()}
  metadata = {CONFIG_METADATA_KEY: json.dumps(cfg.to_dict(), sort_keys=True)}
  output = Path(output).expanduser().absolute()
  if output.suffix == ".safetensors":
    if output.exists() and not overwrite:
      raise mapping.ConversionError(f"output file {output} exists; pass --overwrite to replace it")
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

  return write_atomically(output, fill, overwrite)


def load_saved_flat(path: str | os.PathLike) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """Reads what save_flat wrote (file or directory): (model ConfigDict, flat params)."""
  path = Path(path).expanduser()
  file = path / FLAT_FILE_NAME if path.is_dir() else path
  if not file.is_file():
    raise mapping.ConversionError(f"{path}: no flat params file (expected a .safetensors or a dir with {FLAT_FILE_NAME})")
  metadata, flat = _read_safetensors(file)
  if CONFIG_METADATA_KEY not in metadata:
    raise mapping.ConversionError(f"{file} lacks the '{CONFIG_METADATA_KEY}' metadata written by save_flat")
  cfg = ml_collections.ConfigDict(json.loads(metadata[CONFIG_METADATA_KEY]))
  mapping.check_flat(flat, cfg)
  return cfg, flat
