"""The Hugging Face NeoBERT layout: flat dict <-> HF state_dict (``NeoBERTLMHead`` keys 'model.*' + 'decoder.*'),
model config <-> config.json, and reading HF checkpoints (safetensors, sharded, pytorch_model.bin) into flat params.

Below both train/ and convert/, so neither imports the other. Both directions are exact reshapes and transposes
(bit-exact round trip). `use_bias` adds a ``.bias`` to every block Linear (config.json ``attention_bias`` and
``mlp_bias``); `tie_word_embeddings` drops ``decoder.weight`` as transformers' save_pretrained does."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

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
# Fields written into config.json besides the architecture (defaults of the released model).
CLASSIFIER_INIT_RANGE = 0.02
# model.use_bias: each block Linear's HF name -> its flat bias key. Both layouts order the outputs alike (qkv per
# head q|k|v, w12 gate first), so each converts by a reshape of the layer's slice.
BLOCK_BIASES = {
  'qkv': 'encoder.layers.qkv_bias',
  'wo': 'encoder.layers.wo_bias',
  'ffn.w12': 'encoder.layers.w12_bias',
  'ffn.w3': 'encoder.layers.w3_bias',
}
AUTO_MAP = {
  'AutoConfig': 'model.NeoBERTConfig',
  'AutoModel': 'model.NeoBERTModel',
  'AutoModelForMaskedLM': 'model.NeoBERTLMHead',
  'AutoModelForSequenceClassification': 'model.NeoBERTForSequenceClassification',
}


def hf_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
  """The ``NeoBERTLMHead`` state_dict keys and shapes for ``cfg`` (in the published checkpoint's order)."""
  d = Dims.from_config(cfg)
  shapes = {'model.encoder.weight': (d.vocab, d.dim)}
  for i in range(d.layers):
    block = f'model.transformer_encoder.{i}.'
    shapes[block + 'qkv.weight'] = (3 * d.dim, d.dim)
    shapes[block + 'wo.weight'] = (d.dim, d.dim)
    shapes[block + 'ffn.w12.weight'] = (2 * d.ffn, d.dim)
    shapes[block + 'ffn.w3.weight'] = (d.dim, d.ffn)
    if d.bias:
      for linear in BLOCK_BIASES:  # a Linear's bias is its weight's output rows
        shapes[f'{block}{linear}.bias'] = shapes[f'{block}{linear}.weight'][:1]
    shapes[block + 'attention_norm.weight'] = (d.dim,)
    shapes[block + 'ffn_norm.weight'] = (d.dim,)
  shapes['model.layer_norm.weight'] = (d.dim,)
  if not d.tied:
    shapes['decoder.weight'] = (d.vocab, d.dim)
  shapes['decoder.bias'] = (d.vocab,)
  return shapes


def decoder_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
  """The MLM decoder's entries of hf_shapes (for a placeholder or a fresh decoder where a save has none)."""
  return {k: s for k, s in hf_shapes(cfg).items() if k.startswith('decoder.')}


def flat_to_hf_state_dict(flat: Mapping[str, Any], cfg: Any) -> dict[str, np.ndarray]:
  """JAX flat params -> ``NeoBERTLMHead`` state_dict (numpy arrays, same dtypes, C-contiguous)."""
  check_flat(flat, cfg)
  d = Dims.from_config(cfg)
  f = {k: np.asarray(v) for k, v in flat.items()}
  sd = {'model.encoder.weight': f['encoder.token_embedding.embedding']}
  for i in range(d.layers):
    block = f'model.transformer_encoder.{i}.'
    sd[block + 'qkv.weight'] = f['encoder.layers.qkv'][i].reshape(d.dim, 3 * d.dim).T
    sd[block + 'wo.weight'] = f['encoder.layers.wo'][i].reshape(d.dim, d.dim).T
    sd[block + 'ffn.w12.weight'] = f['encoder.layers.w12'][i].reshape(d.dim, 2 * d.ffn).T
    sd[block + 'ffn.w3.weight'] = f['encoder.layers.w3'][i].T
    if d.bias:
      for linear, key in BLOCK_BIASES.items():
        sd[f'{block}{linear}.bias'] = f[key][i].reshape(-1)
    sd[block + 'attention_norm.weight'] = f['encoder.layers.attention_norm'][i]
    sd[block + 'ffn_norm.weight'] = f['encoder.layers.ffn_norm'][i]
  sd['model.layer_norm.weight'] = f['encoder.final_norm']
  if not d.tied:
    sd['decoder.weight'] = f['decoder.kernel'].T
  sd['decoder.bias'] = f['decoder.bias']
  return {k: np.ascontiguousarray(v) for k, v in sd.items()}


def normalize_hf_state_dict(sd: Mapping[str, Any]) -> dict[str, Any]:
  """Accepts the keys of a base ``NeoBERT`` save (no 'model.' prefix) and drops known weightless buffers."""
  out = {}
  for key, value in sd.items():
    if key.rsplit('.', 1)[-1] in IGNORED_HF_KEYS:
      continue
    if not key.startswith(HF_PREFIX) and not key.startswith('decoder.'):
      key = HF_PREFIX + key
    out[key] = value
  return out


def hf_state_dict_to_flat(sd: Mapping[str, Any], cfg: Any) -> dict[str, np.ndarray]:
  """``NeoBERTLMHead`` state_dict (numpy arrays) -> JAX flat params. Inverse of flat_to_hf_state_dict."""
  sd = normalize_hf_state_dict(sd)
  d = Dims.from_config(cfg)
  if d.tied and 'decoder.weight' in sd and 'model.encoder.weight' in sd:
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

  def stack(suffix, convert):
    return np.stack([convert(s[f'model.transformer_encoder.{i}.{suffix}']) for i in range(d.layers)])

  flat = {
    'encoder.token_embedding.embedding': s['model.encoder.weight'],
    'encoder.layers.attention_norm': stack('attention_norm.weight', lambda w: w),
    'encoder.layers.qkv': stack('qkv.weight', lambda w: w.T.reshape(d.dim, d.heads, 3 * d.head_dim)),
    'encoder.layers.wo': stack('wo.weight', lambda w: w.T.reshape(d.heads, d.head_dim, d.dim)),
    'encoder.layers.ffn_norm': stack('ffn_norm.weight', lambda w: w),
    'encoder.layers.w12': stack('ffn.w12.weight', lambda w: w.T.reshape(d.dim, 2, d.ffn)),
    'encoder.layers.w3': stack('ffn.w3.weight', lambda w: w.T),
    'encoder.final_norm': s['model.layer_norm.weight'],
    'decoder.bias': s['decoder.bias'],
  }
  if not d.tied:
    flat['decoder.kernel'] = s['decoder.weight'].T
  if d.bias:
    shapes = flat_shapes(cfg)
    for linear, key in BLOCK_BIASES.items():
      flat[key] = stack(f'{linear}.bias', lambda b, key=key: b.reshape(shapes[key][1:]))
  return {k: np.ascontiguousarray(v) for k, v in flat.items()}


# JAX ConfigDict field -> config.json field
_FIELD_MAP = {
  'vocab_size': 'vocab_size',
  'hidden_size': 'hidden_size',
  'num_layers': 'num_hidden_layers',
  'num_heads': 'num_attention_heads',
  'intermediate_size': 'intermediate_size',
  'norm_eps': 'norm_eps',
  'rope_theta': 'rope_theta',
  'max_length': 'max_position_embeddings',
  'pad_token_id': 'pad_token_id',
  'embedding_init_range': 'embedding_init_range',
  'decoder_init_range': 'decoder_init_range',
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
  out = {
    'architectures': ['NeoBERTLMHead'],
    'auto_map': dict(AUTO_MAP),
    'model_type': 'neobert',
  }
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


def model_config_from_hf(hf_config: Mapping[str, Any], base=None):
  """A model ConfigDict (defaults of ``base`` or the released model) with the architecture of an HF config.json."""
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
  base = default_model_config() if base is None else base
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
  config, state = _read_hf_files(path)
  if config.get('model_type') == eurobert.MODEL_TYPE:
    return eurobert.to_neobert(config, state)
  return config, state


def _read_hf_files(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  path = Path(path).expanduser()
  if not path.exists():
    raise errors.ExportError(f'--input {path}: no such file or directory')
  folder = path if path.is_dir() else path.parent
  config_path = folder / 'config.json'
  if not config_path.is_file():
    raise errors.ExportError(f"{folder} has no config.json; fix: put the checkpoint's config.json next to its weights")
  hf_config = json.loads(config_path.read_text())
  if path.is_file():
    if path.suffix != '.safetensors':
      raise errors.ExportError(f'--input {path}: expected a directory or a .safetensors file')
    return hf_config, read_safetensors(path)[1]
  if (folder / 'model.safetensors').is_file():
    return hf_config, read_safetensors(folder / 'model.safetensors')[1]
  index = folder / 'model.safetensors.index.json'
  if index.is_file():
    shards = sorted(set(json.loads(index.read_text())['weight_map'].values()))
    state = {}
    for shard in shards:
      state.update(read_safetensors(folder / shard)[1])
    return hf_config, state
  if (folder / 'pytorch_model.bin').is_file():
    import torch  # pylint: disable=g-import-not-at-top  # only this legacy format needs torch

    state = torch.load(folder / 'pytorch_model.bin', map_location='cpu', weights_only=True)
    return hf_config, {k: torch_to_numpy(v) for k, v in state.items()}
  raise errors.ExportError(f'{folder} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin')


def read_hf_dir(
  path: str | os.PathLike, *, init_missing_decoder: bool = False, seed: int = 0
) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """(model ConfigDict, flat params) of an HF NeoBERT checkpoint; ``init_missing_decoder`` creates the MLM decoder
  a base-model save lacks."""
  hf_config, state = read_hf_state_dict(path)
  cfg = model_config_from_hf(hf_config)
  state = normalize_hf_state_dict(state)
  has_decoder = any(k.startswith('decoder.') for k in state)
  if init_missing_decoder and not has_decoder:
    rng = np.random.default_rng(seed)
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
