"""The flat parameter layout, {dotted key: array}, that every loader, converter and tool exchanges: its keys and shapes
per model config, the key/shape check every loader runs, the flat-params safetensors file, and the one way flat host
parameters become device arrays."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping

import jax
import ml_collections
import numpy as np
from flax import nnx, traverse_util

from neobert_jax import config as config_lib
from neobert_jax import errors, paths
from neobert_jax import sharding as shd
from neobert_jax.config.model import default_model_config
from neobert_jax.model.sizes import ffn_hidden_size

CONFIG_METADATA_KEY = 'neobert_jax.model_config'  # the flat-params file's metadata entry with the model config
FLAT_FILE_NAME = 'params.safetensors'  # the file inside a flat-params directory
MODEL_CONFIG_FILE = 'model_config.json'  # beside it, the same config (the directory's commit marker)


@dataclasses.dataclass(frozen=True)
class Dims:
  vocab: int
  dim: int
  layers: int
  heads: int
  head_dim: int
  ffn: int
  bias: bool = False  # model.use_bias: every block's Linears have biases
  tied: bool = False  # model.tie_word_embeddings: no decoder kernel of its own

  @classmethod
  def from_config(cls, cfg: ml_collections.ConfigDict) -> 'Dims':
    """The sizes of a typed model config (validated, read back from a record, or made from a config.json)."""
    if cfg.hidden_size % cfg.num_heads:
      raise errors.ExportError(f'hidden_size={cfg.hidden_size} is not divisible by num_heads={cfg.num_heads}')
    return cls(
      vocab=cfg.vocab_size,
      dim=cfg.hidden_size,
      layers=cfg.num_layers,
      heads=cfg.num_heads,
      head_dim=cfg.hidden_size // cfg.num_heads,
      ffn=ffn_hidden_size(cfg),
      bias=cfg.use_bias,
      tied=cfg.tie_word_embeddings,
    )


def flat_shapes(cfg: ml_collections.ConfigDict) -> dict[str, tuple[int, ...]]:
  """The flat keys and shapes of NeoBERTForMLM for the typed model config ``cfg``."""
  d = Dims.from_config(cfg)
  shapes = {
    'encoder.token_embedding.embedding': (d.vocab, d.dim),
    'encoder.layers.attention_norm': (d.layers, d.dim),
    'encoder.layers.qkv': (d.layers, d.dim, d.heads, 3 * d.head_dim),
    'encoder.layers.wo': (d.layers, d.heads, d.head_dim, d.dim),
    'encoder.layers.ffn_norm': (d.layers, d.dim),
    'encoder.layers.w12': (d.layers, d.dim, 2, d.ffn),
    'encoder.layers.w3': (d.layers, d.ffn, d.dim),
  }
  if d.bias:
    shapes['encoder.layers.qkv_bias'] = (d.layers, d.heads, 3 * d.head_dim)
    shapes['encoder.layers.wo_bias'] = (d.layers, d.dim)
    shapes['encoder.layers.w12_bias'] = (d.layers, 2, d.ffn)
    shapes['encoder.layers.w3_bias'] = (d.layers, d.dim)
  shapes['encoder.final_norm'] = (d.dim,)
  if not d.tied:
    shapes['decoder.kernel'] = (d.dim, d.vocab)
  shapes['decoder.bias'] = (d.vocab,)
  return shapes


def _preview(keys: list[str], limit: int = 6) -> str:
  shown = ', '.join(keys[:limit])
  return shown + (f', ... ({len(keys) - limit} more)' if len(keys) > limit else '')


def check_keys_and_shapes(
  got: Mapping[str, Any],
  expected: Mapping[str, tuple[int, ...]],
  what: str,
  fix: str,
  error: Callable[[str], Exception] = errors.CheckpointError,
) -> None:
  """Raises `error` naming every missing and unexpected key and every wrong shape at once, before any is used."""
  missing = [k for k in expected if k not in got]
  unexpected = [k for k in got if k not in expected]
  problems = []
  if missing:
    problems.append(f'missing keys ({len(missing)}): {_preview(missing)}')
  if unexpected:
    problems.append(f'unexpected keys ({len(unexpected)}): {_preview(unexpected)}')
  for key, shape in expected.items():
    if key in got and tuple(np.shape(got[key])) != tuple(shape):
      problems.append(f'{key}: expected shape {tuple(shape)}, got {tuple(np.shape(got[key]))}')
  if problems:
    raise error(f'{what} does not match the model config:\n  ' + '\n  '.join(problems) + f'\nFix: {fix}')


def check_flat(flat: Mapping[str, Any], cfg: ml_collections.ConfigDict) -> None:
  """Raises ExportError naming every missing/unexpected key and wrong shape of NeoBERTForMLM flat params."""
  check_keys_and_shapes(
    flat,
    flat_shapes(cfg),
    'the flat parameter dict',
    'pass the model config the parameters were trained with (layers, width, heads, vocab, intermediate_size, '
    'use_bias, tie_word_embeddings)',
    errors.ExportError,
  )


def path_names(path: tuple[Any, ...]) -> list[str]:
  """The names along a pytree or nnx state path (dict keys, attribute names, sequence indices), as strings."""
  return [jax.tree_util.keystr((entry,), simple=True) for entry in path]


def path_key(path: tuple[Any, ...]) -> str:
  """A path ('encoder', 'layers', 'qkv'), or a pytree path of the same names, as its flat key 'encoder.layers.qkv'."""
  return jax.tree_util.keystr(tuple(path), simple=True, separator='.')


def to_flat(model: nnx.Module) -> dict[str, np.ndarray]:
  """Gathers every nnx.Param to host memory (fine for export; a sharded run restores on one CPU for that)."""
  state = nnx.state(model, nnx.Param)
  return {path_key(path): np.asarray(jax.device_get(var[...])) for path, var in nnx.to_flat_state(state)}


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, np.ndarray]]:
  """(metadata, arrays) of a safetensors file; ExportError if it is not one."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top

  try:
    with safe_open(str(path), framework='np') as fh:
      return fh.metadata() or {}, {key: fh.get_tensor(key) for key in fh.keys()}
  except Exception as e:  # safetensors raises its own error types for truncated or foreign files
    raise errors.ExportError(f'{path} is not a readable safetensors file ({type(e).__name__}: {e})') from e


def _metadata(cfg: ml_collections.ConfigDict) -> dict[str, str]:
  return {CONFIG_METADATA_KEY: json.dumps(cfg.to_dict(), sort_keys=True)}


def write_flat_file(flat: Mapping[str, np.ndarray], cfg: ml_collections.ConfigDict, path: str | os.PathLike) -> None:
  """Writes flat params + model config as one local safetensors file at `path` (checked against `cfg` first)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  check_flat(flat, cfg)
  save_file({k: np.ascontiguousarray(v) for k, v in flat.items()}, str(path), metadata=_metadata(cfg))


def write_flat_dir(
  flat: Mapping[str, np.ndarray], cfg: ml_collections.ConfigDict, directory: str | os.PathLike
) -> None:
  """Fills a local directory: FLAT_FILE_NAME, then MODEL_CONFIG_FILE (the same config, readable without numpy)."""
  write_flat_file(flat, cfg, os.path.join(directory, FLAT_FILE_NAME))
  paths.write_text(paths.Path(directory) / MODEL_CONFIG_FILE, _metadata(cfg)[CONFIG_METADATA_KEY] + '\n')


def is_flat_file(path: Any) -> bool:
  """Whether `path` (a local or epath path) is a flat-params file or a directory holding one."""
  return (path.is_file() and path.suffix == '.safetensors') or (path / FLAT_FILE_NAME).is_file()


def load_saved_flat(path: str | os.PathLike) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """Reads a flat-params file or directory (local): (model ConfigDict, flat params)."""
  path = os.path.expanduser(os.fspath(path))
  file = os.path.join(path, FLAT_FILE_NAME) if os.path.isdir(path) else path
  if not os.path.isfile(file):
    raise errors.ExportError(f'{path}: no flat params file (expected a .safetensors or a dir with {FLAT_FILE_NAME})')
  metadata, flat = read_safetensors(file)
  if CONFIG_METADATA_KEY not in metadata:
    raise errors.ExportError(f"{file} lacks the '{CONFIG_METADATA_KEY}' metadata of a flat-params file")
  cfg = config_lib.from_record(json.loads(metadata[CONFIG_METADATA_KEY]), default_model_config())
  check_flat(flat, cfg)
  return cfg, flat


def params_from_flat(flat: Mapping[str, np.ndarray], like: Any) -> Any:
  """Flat {dotted key: array} -> params sharded like `like`; each process builds only its devices' shards."""
  expected = traverse_util.flatten_dict(nnx.to_pure_dict(like), sep='.')
  check_keys_and_shapes(
    flat,
    {k: tuple(v.shape) for k, v in expected.items()},
    'the parameters to initialise from',
    'initialise from a checkpoint of the same architecture (layers, width, heads, vocab, intermediate_size)',
  )

  def put(key: str, ref: jax.Array) -> jax.Array:
    host = np.asarray(flat[key], dtype=ref.dtype)
    return jax.make_array_from_callback(ref.shape, ref.sharding, lambda idx: host[idx])

  params = jax.tree.map(lambda a: a, like)
  nnx.replace_by_pure_dict(params, traverse_util.unflatten_dict({k: put(k, v) for k, v in expected.items()}, sep='.'))
  return params


def with_encoder(params: Any, flat: Mapping[str, np.ndarray]) -> Any:
  """`params` with the encoder replaced by `flat`'s 'encoder.*' entries, on its shardings; the head keeps its own."""
  encoder = {k[len('encoder.') :]: v for k, v in flat.items() if k.startswith('encoder.')}
  out = jax.tree.map(lambda a: a, params)
  out['encoder'] = params_from_flat(encoder, params['encoder'])
  return out


def sharded_params(
  make_model: Callable[[], nnx.Module], flat: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh
) -> tuple[Any, Any, Any]:
  """(graphdef, params, shardings) for inference, each device receiving only its shard of `flat`."""
  with shd.activate(mesh):
    graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
    shardings = nnx.get_named_sharding(abstract, mesh)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  return graphdef, params_from_flat(flat, abstract), shardings
