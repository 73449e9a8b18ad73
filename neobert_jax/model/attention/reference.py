"""The plain attention every kernel is checked against, and the 'xla' kernel. The one mask convention: a query of
segment a attends a key of segment b iff a == b and b > 0. Outputs at padding are unspecified but finite in every
kernel, which keeps NaN out of the weight gradients."""

import jax
import jax.numpy as jnp

# Large negative but finite: exp() of it underflows to 0 and a fully masked row stays NaN-free.
MASKED_SCORE = float(jnp.finfo(jnp.float32).min)


def segments_from_lengths(lengths: jax.Array, seq_len: int) -> tuple[jax.Array, jax.Array]:
  """Right-padded rows as (q_segments, kv_segments): every query is live, keys beyond the length are not."""
  real = jnp.arange(seq_len, dtype=jnp.int32)[None, :] < lengths.astype(jnp.int32)[:, None]
  return jnp.ones_like(real, dtype=jnp.int32), real.astype(jnp.int32)


def allowed(q_segments: jax.Array, kv_segments: jax.Array) -> jax.Array:
  """[B, T] and [B, S] segment ids -> boolean [B, 1, T, S]: same segment and the key is not padding."""
  kv = kv_segments[:, None, None, :]
  return (q_segments[:, None, :, None] == kv) & (kv > 0)


def xla_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, q_segments: jax.Array | None = None, kv_segments: jax.Array | None = None
) -> jax.Array:
  """q, k, v [B, T, H, Dh] -> [B, T, H, Dh], fp32 scores. Plain 4-D einsums: jax.nn.dot_product_attention's 5-D
  form runs markedly slower on XLA:CPU."""
  scale = q.shape[-1] ** -0.5
  scores = jnp.einsum('bthd,bshd->bhts', q, k, preferred_element_type=jnp.float32) * scale
  if q_segments is not None:
    scores = jnp.where(allowed(q_segments, kv_segments), scores, MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('bhts,bshd->bthd', probs, v)
