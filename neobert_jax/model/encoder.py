"""NeoBERT in Flax NNX: token embedding -> L pre-RMSNorm blocks (fused qkv, RoPE, SwiGLU) -> RMSNorm -> MLM decoder.

Block weights are always stacked on a leading 'layers' axis, so one checkpoint layout serves `scan_layers=True`
(one compiled block under lax.scan: compile time independent of depth) and the unrolled loop."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from neobert_jax.model.attention import attention
from neobert_jax.config.model import resolve_dots, resolve_dtype, resolve_numerics, validate_model_config
from neobert_jax.model.sizes import ffn_hidden_size, head_dim
from neobert_jax.model.fused import einsum_accumulating, rms_norm, rotate, swiglu, swiglu_autodiff
from neobert_jax.sharding import constrain, creation_scope

_REMAT_POLICIES = {
  'full': jax.checkpoint_policies.nothing_saveable,
  # Keep matmul outputs, recompute the cheap elementwise work (norms, RoPE, SiLU) in the backward pass.
  'save_dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def rope_angles(positions: jax.Array, head_dim: int, theta: float, table_length: int) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B, T, 1, Dh/2] in fp32 of positions x inverse frequencies, looked up in a [table_length, Dh/2] table
  as NeoBERT's `freqs_cis` is: XLA folds the table into a constant instead of trig in every rotation, per head and
  pass (about 5% of the main job's step on a CPU). fused.rotate turns ADJACENT pairs (x[2i], x[2i+1]) by these angles.
  A packed row's positions restart at 0 for every document; a position past the table reads NaN, never a wrong angle."""
  inverse_frequencies = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = jnp.arange(table_length, dtype=jnp.float32)[:, None] * inverse_frequencies
  cos, sin = (jnp.take(f(angles), positions, axis=0, mode='fill', fill_value=jnp.nan) for f in (jnp.cos, jnp.sin))
  return cos[:, :, None, :], sin[:, :, None, :]


def accumulates(cfg: ml_collections.FrozenConfigDict) -> bool:
  """Whether model.dots is 'accumulating' ('auto', or a config.json from before the field: on this backend)."""
  dots = resolve_dots(cfg.get('dots', 'auto'), jax.default_backend(), resolve_dtype(cfg.dtype))
  return dots == 'accumulating'


def _uniform(limit: float):
  """U(-limit, limit), NeoBERT's initialiser for every Linear and the embedding."""
  return functools.partial(jax.random.uniform, minval=-limit, maxval=limit)


def _param(init, key, shape, dtype, axes) -> nnx.Param:
  return nnx.Param(init(key, shape, dtype), out_sharding=axes)


BIASES = ('qkv_bias', 'wo_bias', 'w12_bias', 'w3_bias')  # model.use_bias: one per Linear, named after its kernel


def _biased(y: jax.Array, w: dict[str, jax.Array], name: str) -> jax.Array:
  """y plus the bias `name` when the model has biases (model.use_bias), broadcast over the leading axes."""
  return y + w[name] if name in w else y


class EncoderLayers(nnx.Module):
  """All transformer blocks, weights stacked as [L, ...]. Axis names feed the sharding rules table."""

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    n, d, h, dh, f = cfg.num_layers, cfg.hidden_size, cfg.num_heads, head_dim(cfg), ffn_hidden_size(cfg)
    pdt = jnp.dtype(cfg.param_dtype)
    ones = nnx.initializers.ones
    init = _uniform(cfg.decoder_init_range)
    self.attention_norm = _param(ones, None, (n, d), pdt, ('layers', 'norm'))
    # Last axis per head is [q | k | v], the row grouping of the published fused qkv weight.
    self.qkv = _param(init, rngs.params(), (n, d, h, 3 * dh), pdt, ('layers', 'embed', 'heads', 'head_dim'))
    self.wo = _param(init, rngs.params(), (n, h, dh, d), pdt, ('layers', 'heads', 'head_dim', 'embed'))
    self.ffn_norm = _param(ones, None, (n, d), pdt, ('layers', 'norm'))
    # Gate and up projections kept on a separate axis so tensor parallelism splits both along 'mlp' alike.
    self.w12 = _param(init, rngs.params(), (n, d, 2, f), pdt, ('layers', 'embed', None, 'mlp'))
    self.w3 = _param(init, rngs.params(), (n, f, d), pdt, ('layers', 'mlp', 'embed'))
    if cfg.use_bias:
      # Each bias takes its kernel's output axes, so the one rules table places it like the kernel's output.
      for name, shape, axes in zip(
        BIASES,
        ((n, h, 3 * dh), (n, d), (n, 2, f), (n, d)),
        (('layers', 'heads', 'head_dim'), ('layers', 'embed'), ('layers', None, 'mlp'), ('layers', 'embed')),
      ):
        setattr(self, name, _param(nnx.initializers.zeros, None, shape, pdt, axes))
    self.cfg = ml_collections.FrozenConfigDict(cfg)

  def kernel(self, packed: bool) -> str:
    """The configured kernel; 'auto' is decided here only for direct library use (config/model.resolve_numerics)."""
    if self.cfg.attention_impl != 'auto':
      return self.cfg.attention_impl
    unresolved = ml_collections.ConfigDict(self.cfg.to_dict())  # resolve_numerics sets its fields
    return resolve_numerics(unresolved, platform=jax.default_backend(), packed=packed).kernel

  def __call__(
    self,
    x: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array | None,
    lengths: jax.Array | None,
    max_segments: int | None = None,
  ) -> jax.Array:
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    kernel = self.kernel(segment_ids is not None)
    tile = {'splash': cfg.splash_block_size, 'blockwise': cfg.blockwise_block_size}.get(kernel)
    # Under the layer scan, autodiff saves SwiGLU's intermediates as [layers, ...] fp32 buffers, so the scanned model
    # takes the custom backward pass (it saves only its input); unrolled, autodiff ties on GPU and lets the TPU
    # compiler fuse the activation into the projections (docs/performance.md, "Roofline").
    activate = swiglu if cfg.scan_layers else swiglu_autodiff
    # One table per forward pass, shared by every layer: rows up to the configured length, or the input's if longer.
    cos, sin = rope_angles(positions, head_dim(cfg), cfg.rope_theta, max(cfg.max_length, x.shape[1]))
    einsum = einsum_accumulating if accumulates(cfg) else jnp.einsum

    def block(x, w):
      w = {k: v.astype(dtype) for k, v in w.items()}
      hidden = rms_norm(x, w['attention_norm'], cfg.norm_eps)
      # Three projections from slices of the fused weight, not one split afterwards: no buffer to copy apart, and
      # the v5p cost model prices the slices lower (docs/performance.md, "Roofline").
      q, k, v = (einsum('btd,dhk->bthk', hidden, part) for part in jnp.split(w['qkv'], 3, axis=-1))
      if 'qkv_bias' in w:  # added before the rotation, as a Linear's bias is
        q, k, v = (a + b for a, b in zip((q, k, v), jnp.split(w['qkv_bias'], 3, axis=-1)))
      q, k = rotate(q, cos, sin), rotate(k, cos, sin)
      q, k, v = (constrain(a, ('batch', 'length', 'heads', 'head_dim')) for a in (q, k, v))
      attended = attention(
        q, k, v, segment_ids=segment_ids, lengths=lengths, kernel=kernel, max_segments=max_segments, block_size=tile
      )
      x = x + _biased(einsum('bthk,hkd->btd', attended, w['wo']), w, 'wo_bias')
      x = constrain(x, ('batch', 'length', 'act_embed'))
      gate_up = einsum('btd,dgf->btgf', rms_norm(x, w['ffn_norm'], cfg.norm_eps), w['w12'])
      activated = activate(_biased(gate_up, w, 'w12_bias'))
      x = x + _biased(einsum('btf,fd->btd', activated, w['w3']), w, 'w3_bias')
      return constrain(x, ('batch', 'length', 'act_embed'))

    if cfg.remat_policy != 'none':
      block = jax.checkpoint(block, policy=_REMAT_POLICIES[cfg.remat_policy])
    names = ('attention_norm', 'qkv', 'wo', 'ffn_norm', 'w12', 'w3') + (BIASES if cfg.use_bias else ())
    weights = {name: getattr(self, name)[...] for name in names}
    if cfg.scan_layers:
      return jax.lax.scan(lambda carry, w: (block(carry, w), None), x, weights)[0]
    for i in range(cfg.num_layers):
      x = block(x, jax.tree.map(lambda a: a[i], weights))
    return x


class NeoBERT(nnx.Module):
  """The encoder: returns the final-RMSNorm hidden states [B, T, D]."""

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    validate_model_config(cfg)
    self.cfg = cfg = ml_collections.FrozenConfigDict(cfg)
    with creation_scope():
      self.token_embedding = nnx.Embed(
        cfg.vocab_size,
        cfg.hidden_size,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        embedding_init=nnx.with_partitioning(_uniform(cfg.embedding_init_range), ('vocab', 'embed')),
        rngs=rngs,
      )
      self.layers = EncoderLayers(cfg, rngs=rngs)
      self.final_norm = nnx.Param(jnp.ones((cfg.hidden_size,), jnp.dtype(cfg.param_dtype)), out_sharding=('norm',))

  def __call__(
    self,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    lengths: jax.Array | None = None,
    max_segments: int | None = None,
  ) -> jax.Array:
    """max_segments: the static most documents per packed row, which only the cuDNN packed kernel needs."""
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    # Gather from a table whose embed axis is whole: a gather cannot follow the fsdp split of the table, and
    # letting XLA pick would replicate the whole table onto every device ("involuntary full rematerialization").
    table = constrain(self.token_embedding.embedding[...], ('vocab', None)).astype(self.cfg.dtype)
    x = constrain(jnp.take(table, input_ids, axis=0), ('batch', 'length', 'act_embed'))
    x = self.layers(x, positions, segment_ids, lengths, max_segments)
    return rms_norm(x, self.final_norm[...], self.cfg.norm_eps)


def pool_tokens(hidden: jax.Array, lengths: jax.Array, pooling: str) -> jax.Array:
  """[B, T, D] -> [B, D] float32: masked mean over the first `lengths` tokens, or the first token. One home for
  the sentence embedding of fine-tuning heads (downstream/heads.py) and the pretraining probe (train/probe.py)."""
  if pooling == 'cls':
    return hidden[:, 0].astype(jnp.float32)
  mask = (jnp.arange(hidden.shape[1])[None, :] < lengths[:, None]).astype(jnp.float32)
  total = jnp.einsum('btd,bt->bd', hidden.astype(jnp.float32), mask)
  return total / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)


class TiedDecoder(nnx.Module):
  """The MLM decoder of model.tie_word_embeddings: its own bias, and the token embedding for a kernel."""

  def __init__(self, cfg: ml_collections.ConfigDict):
    self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.dtype(cfg.param_dtype)), out_sharding=('vocab',))


class NeoBERTForMLM(nnx.Module):
  """Encoder + MLM decoder (tied with model.tie_word_embeddings), optionally decoding only some positions."""

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    self.encoder = NeoBERT(cfg, rngs=rngs)
    with creation_scope():
      if cfg.tie_word_embeddings:
        self.decoder = TiedDecoder(cfg)
      else:
        self.decoder = nnx.Linear(
          cfg.hidden_size,
          cfg.vocab_size,
          use_bias=True,
          param_dtype=jnp.dtype(cfg.param_dtype),
          kernel_init=nnx.with_partitioning(_uniform(cfg.decoder_init_range), ('embed', 'vocab')),
          bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ('vocab',)),
          rngs=rngs,
        )
    self.cfg = ml_collections.FrozenConfigDict(cfg)

  def __call__(
    self,
    input_ids: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    lengths: jax.Array | None = None,
    mlm_positions: jax.Array | None = None,
    max_segments: int | None = None,
  ) -> jax.Array:
    """Returns float32 logits [B, T, V], or [B, P, V] for the positions mlm_positions [B, P] (gathered first)."""
    hidden = self.encoder(input_ids, positions, segment_ids, lengths, max_segments)
    if mlm_positions is not None:
      hidden = jnp.take_along_axis(hidden, mlm_positions[:, :, None].astype(jnp.int32), axis=1)
    dtype = jnp.dtype(self.cfg.dtype)
    if self.cfg.tie_word_embeddings:
      kernel, spec = self.encoder.token_embedding.embedding[...], 'bpd,vd->bpv'
    else:
      kernel, spec = self.decoder.kernel[...], 'bpd,dv->bpv'
    written = jnp.float32 if self.cfg.logits_dot_in_fp32 else dtype  # model.logits_dot_in_fp32
    hidden, kernel = hidden.astype(dtype), kernel.astype(dtype)
    if accumulates(self.cfg):
      logits = einsum_accumulating(spec, hidden, kernel, written)
    else:
      logits = jnp.einsum(spec, hidden, kernel, preferred_element_type=written)
    logits = logits.astype(jnp.float32) + self.decoder.bias[...].astype(jnp.float32)
    return constrain(logits, ('batch', 'length', 'vocab'))
