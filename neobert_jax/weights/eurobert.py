"""NeoBERT's Hugging Face layout <-> transformers' own EuroBERT layout (``model_type`` 'eurobert'), which
transformers >= 5.3 loads without ``trust_remote_code``. The layouts differ by exact permutations and splits: RoPE on
adjacent pairs vs halves, fused ``qkv`` / ``w12`` vs separate projections, and the decoder bias (EuroBERT's
``lm_head`` has one only with ``mlp_bias``, so a non-zero one sets it with zero feed-forward biases)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from neobert_jax import errors

MODEL_TYPE = 'eurobert'
NEOBERT_PREFIX = 'model.transformer_encoder.'
# transformers' ACT2FN names for SiLU, the gate's activation in SwiGLU.
SILU = ('silu', 'swish')
SWIGLU_MULTIPLE = 8  # NeoBERT's SwiGLU width is a multiple of 8 (model/sizes.py's ffn_hidden_size)


def _rope_order(head_dim: int) -> np.ndarray:
  """Row order within a head that turns NeoBERT's adjacent-pair rotation into EuroBERT's rotate-half."""
  return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def _heads(rows: np.ndarray, heads: int) -> np.ndarray:
  return rows.reshape(heads, -1, *rows.shape[1:])


def _split_qkv(qkv: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """NeoBERT's per-head [q | k | v] rows (weight [3D, D] or bias [3D]) -> EuroBERT's q, k, v rows, q and k in
  rotate-half order."""
  per_head = _heads(qkv, heads)  # [H, 3*Dh, ...]
  head_dim = per_head.shape[1] // 3
  order = _rope_order(head_dim)
  q, k, v = (per_head[:, i * head_dim : (i + 1) * head_dim] for i in range(3))
  flat = lambda x: x.reshape(heads * head_dim, *qkv.shape[1:])  # noqa: E731
  return flat(q[:, order]), flat(k[:, order]), flat(v)


def _fuse_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int) -> np.ndarray:
  """Inverse of _split_qkv."""
  head_dim = q.shape[0] // heads
  back = np.argsort(_rope_order(head_dim))
  q, k, v = _heads(q, heads)[:, back], _heads(k, heads)[:, back], _heads(v, heads)
  return np.concatenate([q, k, v], axis=1).reshape(3 * heads * head_dim, *q.shape[2:])


def from_neobert(state: Mapping[str, np.ndarray], config: Mapping[str, Any], special_ids: Mapping[str, int]):
  """(EuroBERT state_dict, config.json) for a ``NeoBERTLMHead`` state_dict and its config.json (hf.hf_config_dict's
  fields); ``special_ids`` are the tokenizer's bos / eos / mask ids where it has them (EuroBERT's defaults are its own
  vocabulary's)."""
  heads, layers = config['num_attention_heads'], config['num_hidden_layers']
  decoder_bias = np.asarray(state['decoder.bias'])
  mlp_bias = bool(config['mlp_bias']) or bool(np.any(decoder_bias != 0))
  out = {'model.embed_tokens.weight': state['model.encoder.weight']}
  for i in range(layers):
    src, dst = f'{NEOBERT_PREFIX}{i}.', f'model.layers.{i}.'
    for kind in ('weight', 'bias'):  # a NeoBERT with model.use_bias has both kinds, else weights only
      if f'{src}qkv.{kind}' in state:
        q, k, v = _split_qkv(np.asarray(state[f'{src}qkv.{kind}']), heads)
        out.update({f'{dst}self_attn.{n}_proj.{kind}': x for n, x in zip('qkv', (q, k, v))})
        out[f'{dst}self_attn.o_proj.{kind}'] = state[f'{src}wo.{kind}']
      if f'{src}ffn.w12.{kind}' in state:
        gate_up = np.split(np.asarray(state[f'{src}ffn.w12.{kind}']), 2)
        out[f'{dst}mlp.gate_proj.{kind}'], out[f'{dst}mlp.up_proj.{kind}'] = gate_up
        out[f'{dst}mlp.down_proj.{kind}'] = state[f'{src}ffn.w3.{kind}']
    if mlp_bias and f'{src}ffn.w12.bias' not in state:  # the head's bias switches the feed-forward's on
      w12 = np.asarray(state[f'{src}ffn.w12.weight'])  # zeros leave it as it was
      out[f'{dst}mlp.gate_proj.bias'] = out[f'{dst}mlp.up_proj.bias'] = np.zeros(w12.shape[0] // 2, w12.dtype)
      out[f'{dst}mlp.down_proj.bias'] = np.zeros(w12.shape[1], w12.dtype)
    out[f'{dst}input_layernorm.weight'] = state[f'{src}attention_norm.weight']
    out[f'{dst}post_attention_layernorm.weight'] = state[f'{src}ffn_norm.weight']
  out['model.norm.weight'] = state['model.layer_norm.weight']
  if 'decoder.weight' in state:
    out['lm_head.weight'] = state['decoder.weight']
  if mlp_bias:
    out['lm_head.bias'] = decoder_bias
  # EuroBERT's intermediate_size is the SwiGLU width (NeoBERT's is the 4x MLP's it derives the width from).
  eurobert_config = {
    'architectures': ['EuroBertForMaskedLM'],
    'model_type': MODEL_TYPE,
    'vocab_size': config['vocab_size'],
    'hidden_size': config['hidden_size'],
    'intermediate_size': int(state[f'{NEOBERT_PREFIX}0.ffn.w3.weight'].shape[1]),
    'num_hidden_layers': config['num_hidden_layers'],
    'num_attention_heads': config['num_attention_heads'],
    'num_key_value_heads': config['num_attention_heads'],
    'head_dim': config['hidden_size'] // config['num_attention_heads'],
    'hidden_act': 'silu',
    'max_position_embeddings': config['max_position_embeddings'],
    'rms_norm_eps': config['norm_eps'],
    'rope_parameters': {'rope_type': 'default', 'rope_theta': float(config['rope_theta'])},
    'attention_bias': bool(config['attention_bias']),
    'mlp_bias': mlp_bias,
    'tie_word_embeddings': bool(config['tie_word_embeddings']),
    'pad_token_id': config['pad_token_id'],
    'bos_token_id': special_ids.get('bos'),
    'eos_token_id': special_ids.get('eos'),
    'initializer_range': config.get('decoder_init_range', 0.02),
    'torch_dtype': config.get('torch_dtype', 'float32'),
    'use_cache': False,
  }
  if 'mask' in special_ids:
    eurobert_config['mask_token_id'] = special_ids['mask']
  return {k: np.ascontiguousarray(v) for k, v in out.items()}, dict(sorted(eurobert_config.items()))


def to_neobert(config: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
  """(NeoBERT config.json, ``NeoBERTLMHead`` state_dict) for a EuroBERT directory's config.json and state_dict
  (``EuroBertForMaskedLM``, 'model.*' + 'lm_head.*', or a base ``EuroBertModel`` save without the prefix)."""
  heads = config['num_attention_heads']
  problems = []
  if config.get('num_key_value_heads', heads) != heads:
    problems.append(f'num_key_value_heads={config["num_key_value_heads"]} (grouped keys and values)')
  if config.get('head_dim') not in (None, config['hidden_size'] // heads):
    problems.append(f'head_dim={config["head_dim"]} (not hidden_size / num_attention_heads)')
  if config['intermediate_size'] % SWIGLU_MULTIPLE:
    problems.append(f'intermediate_size={config["intermediate_size"]} (NeoBERT rounds it to a multiple of 8)')
  if config.get('hidden_act', 'silu') not in SILU:
    problems.append(f'hidden_act={config["hidden_act"]!r}')
  rope = config.get('rope_parameters') or {}
  if rope.get('rope_type', 'default') != 'default' or config.get('rope_scaling'):
    problems.append(f'RoPE scaling {rope or config.get("rope_scaling")}')
  if problems:
    raise errors.ExportError(
      f'this EuroBERT config.json has {", ".join(problems)}, which NeoBERT cannot hold: only EuroBERTs with a key '
      'and value head per query head, SiLU and plain RoPE convert'
    )
  state = {k if k.startswith(('model.', 'lm_head.')) else f'model.{k}': np.asarray(v) for k, v in state.items()}
  attention_bias = bool(config.get('attention_bias', False))
  neo_config = {
    'model_type': 'neobert',
    'vocab_size': config['vocab_size'],
    'hidden_size': config['hidden_size'],
    'num_hidden_layers': config['num_hidden_layers'],
    'num_attention_heads': heads,
    # NeoBERT's SwiGLU is 2/3 of intermediate_size rounded up to 8 (model/sizes.py): 3/2 of the width gives it back.
    'intermediate_size': 3 * config['intermediate_size'] // 2,
    'norm_eps': config.get('rms_norm_eps', 1e-5),
    'rope_theta': rope.get('rope_theta', config.get('rope_theta', 10000.0)),
    'max_position_embeddings': config.get('max_position_embeddings'),
    'pad_token_id': config.get('pad_token_id'),
    'attention_bias': attention_bias,
    'mlp_bias': attention_bias,  # NeoBERT's one switch: the feed-forward's biases follow the attention's
    'tie_word_embeddings': bool(config.get('tie_word_embeddings', False)),
  }
  out = {'model.encoder.weight': state['model.embed_tokens.weight']}
  for i in range(config['num_hidden_layers']):
    src, dst = f'model.layers.{i}.', f'{NEOBERT_PREFIX}{i}.'
    kinds = ('weight', 'bias') if attention_bias else ('weight',)
    for kind in kinds:
      q, k, v = (state[f'{src}self_attn.{n}_proj.{kind}'] for n in 'qkv')
      out[f'{dst}qkv.{kind}'] = _fuse_qkv(q, k, v, heads)
      out[f'{dst}wo.{kind}'] = state[f'{src}self_attn.o_proj.{kind}']
    weights = {n: state[f'{src}mlp.{n}_proj.weight'] for n in ('gate', 'up', 'down')}
    biases = {n: state.get(f'{src}mlp.{n}_proj.bias') for n in weights}
    if attention_bias:  # a missing feed-forward bias is zero
      gate, up, down = (np.zeros(len(w), w.dtype) if biases[n] is None else biases[n] for n, w in weights.items())
      out[f'{dst}ffn.w12.bias'], out[f'{dst}ffn.w3.bias'] = np.concatenate([gate, up]), down
    elif any(b is not None and np.any(b != 0) for b in biases.values()):
      raise errors.ExportError(
        f'layer {i} of this EuroBERT has feed-forward biases that are not zero but no attention biases; NeoBERT has '
        'one switch for both (model.use_bias): only checkpoints with both, or with zero feed-forward biases, convert'
      )
    out[f'{dst}ffn.w12.weight'] = np.concatenate([weights['gate'], weights['up']])
    out[f'{dst}ffn.w3.weight'] = weights['down']
    out[f'{dst}attention_norm.weight'] = state[f'{src}input_layernorm.weight']
    out[f'{dst}ffn_norm.weight'] = state[f'{src}post_attention_layernorm.weight']
  out['model.layer_norm.weight'] = state['model.norm.weight']
  if 'lm_head.weight' in state:
    out['decoder.weight'] = state['lm_head.weight']
  if 'lm_head.bias' in state:
    out['decoder.bias'] = state['lm_head.bias']
  elif 'lm_head.weight' in state or neo_config['tie_word_embeddings']:  # a head without a bias: NeoBERT's is zero
    out['decoder.bias'] = np.zeros(config['vocab_size'], out['model.encoder.weight'].dtype)
  return {k: v for k, v in neo_config.items() if v is not None}, out
