"""The Hugging Face NeoBERT layout: flat dict <-> HF state_dict (``NeoBERTLMHead`` keys 'model.*' + 'decoder.*'),
model config <-> config.json, and reading HF checkpoints (safetensors, sharded, pytorch_model.bin) into flat params.
Below both train/ and convert/, so neither imports the other; both directions are exact (bit-exact round trip)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import ml_collections
import numpy as np

from neobert_jax import config as config_lib
from neobert_jax import errors
from neobert_jax.config.model import default_model_config
from neobert_jax.weights import eurobert
from neobert_jax.weights.flat import Dims, check_flat, check_keys_and_shapes, flat_shapes, read_safetensors

HF_PREFIX = 'model.'
# The weight files an HF directory may hold, in the order they are looked for.
WEIGHT_FILES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin')
# Non-persistent buffers some NeoBERT modeling files have written into checkpoints; they carry no weights.
IGNORED_HF_KEYS = ('freqs_cis', 'freqs_cos', 'freqs_sin')
CLASSIFIER_INIT_RANGE = 0.02  # written into config.json: the released model's default
AUTO_MAP = {
  'AutoConfig': 'model.NeoBERTConfig',
  'AutoModel': 'model.NeoBERTModel',
  'AutoModelForMaskedLM': 'model.NeoBERTLMHead',
  'AutoModelForSequenceClassification': 'model.NeoBERTForSequenceClassification',
}


def _tensors(cfg: Any) -> Iterator[tuple[str, str, int | None, tuple[int, ...], bool]]:
  """The one table of both layouts: (HF name, flat key, layer or None, HF shape, transposed) for every tensor, in the
  published checkpoint's order. A block tensor is one layer's slice of its flat key. torch stores a Linear's weight
  [out, in], so those are transposed against the flat [in, ..., out]; both layouts order the outputs alike (qkv
  per head q|k|v, w12 gate first), so the rest is a reshape."""
  d = Dims.from_config(cfg)
  linears = {  # HF name -> (flat key, HF weight shape [out, in]); model.use_bias gives each a '<key>_bias'
    'qkv': ('encoder.layers.qkv', (3 * d.dim, d.dim)),
    'wo': ('encoder.layers.wo', (d.dim, d.dim)),
    'ffn.w12': ('encoder.layers.w12', (2 * d.ffn, d.dim)),
    'ffn.w3': ('encoder.layers.w3', (d.dim, d.ffn)),
  }
  block = [(f'{name}.weight', key, shape, True) for name, (key, shape) in linears.items()]
  if d.bias:  # a Linear's bias is its weight's output rows
    block += [(f'{name}.bias', f'{key}_bias', shape[:1], False) for name, (key, shape) in linears.items()]
  block += [
    ('attention_norm.weight', 'encoder.layers.attention_norm', (d.dim,), False),
    ('ffn_norm.weight', 'encoder.layers.ffn_norm', (d.dim,), False),
  ]
  yield 'model.encoder.weight', 'encoder.token_embedding.embedding', None, (d.vocab, d.dim), False
  for i in range(d.layers):
    for name, key, shape, transposed in block:
      yield f'model.transformer_encoder.{i}.{name}', key, i, shape, transposed
  yield 'model.layer_norm.weight', 'encoder.final_norm', None, (d.dim,), False
  if not d.tied:
    yield 'decoder.weight', 'decoder.kernel', None, (d.vocab, d.dim), True
  yield 'decoder.bias', 'decoder.bias', None, (d.vocab,), False


def hf_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
  """The ``NeoBERTLMHead`` state_dict keys and shapes for ``cfg`` (in the published checkpoint's order)."""
  return {name: shape for name, _, _, shape, _ in _tensors(cfg)}


def decoder_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
  """The MLM decoder's entries of hf_shapes (for a placeholder or a fresh decoder where a save has none)."""
  return {k: s for k, s in hf_shapes(cfg).items() if k.startswith('decoder.')}


def flat_to_hf_state_dict(flat: Mapping[str, Any], cfg: Any) -> dict[str, np.ndarray]:
  """JAX flat params -> ``NeoBERTLMHead`` state_dict (numpy arrays, same dtypes, C-contiguous)."""
  check_flat(flat, cfg)
  f = {k: np.asarray(v) for k, v in flat.items()}
  sd = {}
  for name, key, layer, shape, transposed in _tensors(cfg):
    x = f[key] if layer is None else f[key][layer]
    sd[name] = np.ascontiguousarray(x.reshape(shape[::-1]).T if transposed else x.reshape(shape))
  return sd


def normalize_hf_state_dict(sd: Mapping[str, Any]) -> dict[str, Any]:
  """Accepts the keys of a base ``NeoBERT`` save (no 'model.' prefix) and drops known weightless buffers."""
  return {
    k if k.startswith((HF_PREFIX, 'decoder.')) else HF_PREFIX + k: v
    for k, v in sd.items()
    if k.rsplit('.', 1)[-1] not in IGNORED_HF_KEYS
  }


def hf_state_dict_to_flat(sd: Mapping[str, Any], cfg: Any) -> dict[str, np.ndarray]:
  """``NeoBERTLMHead`` state_dict (numpy arrays) -> JAX flat params. Inverse of flat_to_hf_state_dict."""
  sd = normalize_hf_state_dict(sd)
  if cfg.tie_word_embeddings and 'decoder.weight' in sd and 'model.encoder.weight' in sd:
    if np.array_equal(np.asarray(sd['decoder.weight']), np.asarray(sd['model.encoder.weight'])):
      sd = {k: v for k, v in sd.items() if k != 'decoder.weight'}  # the tied head's second name, not a weight
  check_keys_and_shapes(
    sd,
    hf_shapes(cfg),
    'the Hugging Face state_dict',
    'make sure config.json matches model.safetensors (num_hidden_layers, hidden_size, num_attention_heads, '
    'intermediate_size, vocab_size, attention_bias, mlp_bias, tie_word_embeddings) and that the checkpoint is a '
    "NeoBERTLMHead (keys 'model.*' + 'decoder.*')",
    errors.ExportError,
  )
  s = {k: np.asarray(v) for k, v in sd.items()}
  shapes = flat_shapes(cfg)
  flat, layers = {}, {}
  for name, key, layer, _, transposed in _tensors(cfg):
    w = s[name].T if transposed else s[name]
    if layer is None:
      flat[key] = w.reshape(shapes[key])
    else:
      layers.setdefault(key, []).append(w.reshape(shapes[key][1:]))
  flat.update({key: np.stack(slices) for key, slices in layers.items()})
  return {key: np.ascontiguousarray(flat[key]) for key in shapes}


# JAX ConfigDict field -> config.json field: three renamed, the others spelt alike
_SAME_NAMES = ('vocab_size', 'hidden_size', 'intermediate_size', 'norm_eps', 'rope_theta', 'pad_token_id')
_FIELD_MAP = {
  'num_layers': 'num_hidden_layers',
  'num_heads': 'num_attention_heads',
  'max_length': 'max_position_embeddings',
  **{name: name for name in (*_SAME_NAMES, 'embedding_init_range', 'decoder_init_range')},
}
_ARCHITECTURE_FLAGS = {
  'rope': lambda v: v is True,
  'rms_norm': lambda v: v is True,
  'hidden_act': lambda v: str(v).lower() == 'swiglu',
  'ngpt': lambda v: v is False,
}
# Exports written before issue 37, and the published chandar-lab/NeoBERT, name the sequence length max_length: a
# generation parameter to transformers 5, which then refuses to save the config. It is read, never written.
LEGACY_MAX_LENGTH = 'max_length'
_REQUIRED_HF_FIELDS = ('vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'intermediate_size')


def hf_config_dict(cfg: Any, torch_dtype: str = 'float32') -> dict[str, Any]:
  """config.json content of an exported NeoBERTLMHead directory for the model config ``cfg``."""
  d = Dims.from_config(cfg)
  out = {'architectures': ['NeoBERTLMHead'], 'auto_map': dict(AUTO_MAP), 'model_type': 'neobert'}
  for jax_name, hf_name in _FIELD_MAP.items():
    value = cfg[jax_name]
    out[hf_name] = value.item() if hasattr(value, 'item') else value
  out['dim_head'] = d.head_dim
  out['classifier_init_range'] = CLASSIFIER_INIT_RANGE
  out['attention_bias'] = out['mlp_bias'] = bool(cfg.use_bias)
  out['tie_word_embeddings'] = bool(cfg.tie_word_embeddings)
  out['torch_dtype'] = torch_dtype
  return dict(sorted(out.items()))


def _layout_flag(hf_config: Mapping[str, Any], name: str) -> bool:
  value = hf_config.get(name)
  if value is None:
    return False
  if not isinstance(value, bool):
    raise errors.ExportError(f'config.json has {name}={value!r}; expected true or false')
  return value


def max_positions(hf_config: Mapping[str, Any]) -> int:
  """The longest sequence a config.json gives: max_position_embeddings, or an older export's max_length."""
  value = hf_config.get('max_position_embeddings', hf_config.get(LEGACY_MAX_LENGTH))
  if value is None:
    raise errors.ExportError('config.json gives no sequence length (max_position_embeddings or max_length)')
  return int(value)


def model_config_from_hf(hf_config: Mapping[str, Any]):
  """A model ConfigDict (the released model's defaults) with the architecture of an HF config.json."""
  model_type = hf_config.get('model_type')
  if model_type != 'neobert':
    raise errors.ExportError(
      f"config.json has model_type={model_type!r}, expected 'neobert' (or 'eurobert', which read_hf_state_dict "
      'translates): this is not a NeoBERT checkpoint'
    )
  missing = [k for k in _REQUIRED_HF_FIELDS if k not in hf_config]
  if missing:
    raise errors.ExportError(
      f'config.json lacks {missing}; fix: add them (see the published chandar-lab/NeoBERT config)'
    )
  # Variant flags some NeoBERT configs carry; this port implements only the released architecture.
  unsupported = {k: hf_config[k] for k, ok in _ARCHITECTURE_FLAGS.items() if k in hf_config and not ok(hf_config[k])}
  if unsupported:
    raise errors.ExportError(
      f'config.json selects an architecture variant this port does not implement: {unsupported}; only the '
      'released NeoBERT (RoPE, RMSNorm, SwiGLU, no nGPT) converts'
    )
  base = default_model_config()
  fields = {j: type(base[j])(hf_config[h]) for j, h in _FIELD_MAP.items() if hf_config.get(h) is not None}
  if hf_config.get('max_position_embeddings') is None and hf_config.get(LEGACY_MAX_LENGTH) is not None:
    fields['max_length'] = int(hf_config[LEGACY_MAX_LENGTH])
  # The layout flags: absent (the published NeoBERT, older exports) is the released layout.
  fields['use_bias'] = _layout_flag(hf_config, 'attention_bias')
  if _layout_flag(hf_config, 'mlp_bias') != fields['use_bias']:
    raise errors.ExportError(
      f'config.json has attention_bias={hf_config.get("attention_bias")} and mlp_bias={hf_config.get("mlp_bias")}; '
      'this port has one switch for both (model.use_bias): only checkpoints with both or neither convert'
    )
  fields['tie_word_embeddings'] = _layout_flag(hf_config, 'tie_word_embeddings')
  cfg = config_lib.replace(base, fields)
  dim_head = hf_config.get('dim_head')
  if dim_head is not None and dim_head * cfg.num_heads != cfg.hidden_size:
    raise errors.ExportError(
      f'config.json dim_head={dim_head} x num_attention_heads={cfg.num_heads} != hidden_size={cfg.hidden_size}; '
      'NeoBERT requires dim_head = hidden_size / num_attention_heads'
    )
  return cfg


def torch_to_numpy(tensor: Any) -> np.ndarray:
  """A torch tensor's values as numpy (bfloat16 through ml_dtypes, which numpy lacks)."""
  import torch  # pylint: disable=g-import-not-at-top  # only pytorch_model.bin and the PyTorch model need torch

  tensor = tensor.detach().cpu().contiguous()
  if tensor.dtype == torch.bfloat16:
    import ml_dtypes  # pylint: disable=g-import-not-at-top  # installed with jax

    return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
  return tensor.numpy()


def read_hf_state_dict(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json as a dict, state_dict as numpy arrays) of an HF directory or .safetensors file, in NeoBERT's
  layout: a EuroBERT directory (``convert to-pytorch --model-type eurobert``) is translated by weights/eurobert.py."""
  path = Path(path).expanduser()
  if not path.exists():
    raise errors.ExportError(f'--input {path}: no such file or directory')
  folder = path if path.is_dir() else path.parent
  config_path = folder / 'config.json'
  if not config_path.is_file():
    raise errors.ExportError(f"{folder} has no config.json; fix: put the checkpoint's config.json next to its weights")
  hf_config = json.loads(config_path.read_text())
  index = folder / 'model.safetensors.index.json'
  if path.is_file():
    if path.suffix != '.safetensors':
      raise errors.ExportError(f'--input {path}: expected a directory or a .safetensors file')
    state = read_safetensors(path)[1]
  elif (folder / 'model.safetensors').is_file():
    state = read_safetensors(folder / 'model.safetensors')[1]
  elif index.is_file():
    state = {}
    for shard in sorted(set(json.loads(index.read_text())['weight_map'].values())):
      state.update(read_safetensors(folder / shard)[1])
  elif (folder / 'pytorch_model.bin').is_file():
    import torch  # pylint: disable=g-import-not-at-top  # only this legacy format needs torch

    state = torch.load(folder / 'pytorch_model.bin', map_location='cpu', weights_only=True)
    state = {k: torch_to_numpy(v) for k, v in state.items()}
  else:
    raise errors.ExportError(f'{folder} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin')
  if hf_config.get('model_type') == eurobert.MODEL_TYPE:
    return eurobert.to_neobert(hf_config, state)
  return hf_config, state


def read_hf_dir(
  path: str | os.PathLike, *, init_missing_decoder: bool = False
) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """(model ConfigDict, flat params) of an HF NeoBERT checkpoint; ``init_missing_decoder`` creates the MLM decoder
  a base-model save lacks."""
  hf_config, state = read_hf_state_dict(path)
  cfg = model_config_from_hf(hf_config)
  state = normalize_hf_state_dict(state)
  has_decoder = any(k.startswith('decoder.') for k in state)
  if init_missing_decoder and not has_decoder:
    rng = np.random.default_rng(0)
    limit = cfg.decoder_init_range
    dtype = state['model.encoder.weight'].dtype if 'model.encoder.weight' in state else np.float32
    for key, shape in decoder_shapes(cfg).items():  # a tied decoder has only its bias
      state[key] = np.zeros(shape, dtype) if key == 'decoder.bias' else rng.uniform(-limit, limit, shape).astype(dtype)
  try:
    return cfg, hf_state_dict_to_flat(state, cfg)
  except errors.ExportError as e:
    if 'decoder.' in str(e) and not has_decoder:
      raise errors.ExportError(
        f'{e}\nThis looks like a base NeoBERT save without the MLM head: pass --init-missing-decoder '
        '(init_missing_decoder=True) to create a fresh decoder'
      ) from e
    raise
