"""Bidirectional attention with NeoBERT's three masking modes: cuDNN flash attention through
jax.nn.dot_product_attention on GPU, plain XLA einsums elsewhere.

- none: every token attends to every token.
- padding: per-row lengths (right padding). cuDNN runs its plain flash kernel and no T x T mask is built.
- packed: segment ids; a token attends only inside its own document and padding (segment 0) attends nowhere.
  On cuDNN the boolean mask becomes an additive bias (fmhaScaleBiasSoftmax): slower than padding mode but never
  silently dropped, because jax.nn.dot_product_attention has no segment-id argument for cuDNN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HALF_PRECISION = (jnp.bfloat16, jnp.float16)


def resolve_implementation(requested: str, dtype) -> str:
  """'auto' -> cuDNN on a GPU backend with half-precision compute (its only supported dtypes), else XLA."""
  if requested != "auto":
    return requested
  on_gpu = jax.default_backend() == "gpu"
  return "cudnn" if on_gpu and jnp.dtype(dtype) in map(jnp.dtype, _HALF_PRECISION) else "xla"


def segment_mask(segment_ids: jax.Array) -> jax.Array:
  """[B, T] segment ids -> boolean [B, 1, T, T]: same document and the key is not padding."""
  same_doc = segment_ids[:, :, None] == segment_ids[:, None, :]
  return (same_doc & (segment_ids[:, None, :] > 0))[:, None, :, :]


def _xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Softmax attention as two 4-D [B, H, T, S] einsums with the scores and softmax in fp32.

  The same math as jax.nn.dot_product_attention(implementation='xla'), written without its grouped-query 5-D
  formulation: XLA:CPU runs these plain batched matmuls about twice as fast (forward + backward), and TPU
  compiles both alike. A masked-out key gets the most negative finite score, so a row with no valid key (padding
  in a packed row) yields finite, ignored values instead of NaNs.
  """
  scale = q.shape[-1] ** -0.5
  scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bhts,bshd->bthd", probs, v)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, segment_ids: jax.Array | None = None,
              lengths: jax.Array | None = None, implementation: str = "xla") -> jax.Array:
  """q, k, v: [B, T, H, Dh] -> [B, T, H, Dh]. Give segment_ids (packed rows) or lengths (padded rows), or neither."""
  if segment_ids is not None and lengths is not None:
    raise ValueError("pass segment_ids (packed rows) or lengths (padded rows), not both.")
  if implementation == "xla":
    if segment_ids is not None:
      return _xla_attention(q, k, v, segment_mask(segment_ids))
    if lengths is not None:
      key_is_real = jnp.arange(k.shape[1], dtype=jnp.int32)[None, :] < lengths.astype(jnp.int32)[:, None]
      return _xla_attention(q, k, v, key_is_real[:, None, None, :])
    return _xla_attention(q, k, v, None)
  if q.dtype not in map(jnp.dtype, _HALF_PRECISION):
    raise ValueError(f"cuDNN attention needs bfloat16 or float16 inputs, got {q.dtype}; "
                     "set model.dtype='bfloat16' or model.attention_impl='xla'.")
  if segment_ids is not None:
    if q.shape[1] % 2:
      raise ValueError(f"cuDNN attention with a segment mask needs an even sequence length, got {q.shape[1]}.")
    return jax.nn.dot_product_attention(q, k, v, mask=segment_mask(segment_ids), implementation="cudnn")
  if lengths is not None:
    lengths = lengths.astype(jnp.int32)
    return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                                        implementation="cudnn")
  return jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
