"""The 'xla' kernel: masked einsums with FlashAttention's backward on the saved probabilities (every kernel is tested
against plain autodiff, tests/support/attention_reference.py). The one mask convention: a query of segment a attends
a key of segment b iff a == b and b > 0. Outputs at padding are unspecified but finite in every kernel, which keeps
NaN out of the weight gradients."""

import jax
import jax.numpy as jnp

# Large negative but finite: exp() of it underflows to 0 and a fully masked row stays NaN-free.
MASKED_SCORE = float(jnp.finfo(jnp.float32).min)
F32 = jnp.float32


def segments_from_lengths(lengths: jax.Array, seq_len: int) -> tuple[jax.Array, jax.Array]:
  """Right-padded rows as (q_segments, kv_segments): every query is live, keys beyond the length are not."""
  real = jnp.arange(seq_len, dtype=jnp.int32)[None, :] < lengths.astype(jnp.int32)[:, None]
  return jnp.ones_like(real, dtype=jnp.int32), real.astype(jnp.int32)


def allowed(q_segments: jax.Array, kv_segments: jax.Array) -> jax.Array:
  """[B, T] and [B, S] segment ids -> boolean [B, 1, T, S]: same segment and the key is not padding."""
  kv = kv_segments[:, None, None, :]
  return (q_segments[:, None, :, None] == kv) & (kv > 0)


def _forward(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """(output [B, T, H, Dh] in fp32, probabilities [B, H, T, S] in v's dtype) from fp32 scores; the dot with v
  accumulates in fp32 (a bfloat16 einsum with no preferred type becomes an fp32 dot on XLA:CPU, half as fast)."""
  scores = jnp.einsum('bthd,bshd->bhts', q, k, preferred_element_type=F32) * q.shape[-1] ** -0.5
  if mask is not None:
    scores = jnp.where(mask, scores, MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('bhts,bshd->bthd', probs, v, preferred_element_type=F32), probs


_attend = jax.custom_vjp(lambda q, k, v, mask: _forward(q, k, v, mask)[0].astype(v.dtype))


def _attend_fwd(q, k, v, mask):
  out, probs = _forward(q, k, v, mask)
  return out.astype(v.dtype), (q, k, v, probs, out)


def _attend_bwd(residuals, d_out):
  """FlashAttention's backward on the saved probabilities: the softmax's row sum is rowsum(dO * O) over [B, T, H]
  with O in fp32 (the rounded O raised the bfloat16 error 1.3x); masked keys have probability 0 (no select); dS
  enters bfloat16 x bfloat16 -> fp32 dots; the scale goes on dQ, dK (on dS XLA:CPU wrote a [B, H, T, S] array of it).
  Queries with no allowed key get a gradient only their (unread) outputs' cotangent feeds."""
  q, k, v, probs, out = residuals
  d_out = d_out.astype(v.dtype)
  d_v = jnp.einsum('bhts,bthd->bshd', probs, d_out, preferred_element_type=F32)
  d_probs = jnp.einsum('bthd,bshd->bhts', d_out, v, preferred_element_type=F32)
  row = jnp.einsum('bthd,bthd->bht', d_out.astype(F32), out)[..., None]
  d_scores = (probs.astype(F32) * (d_probs - row)).astype(q.dtype)
  scale = q.shape[-1] ** -0.5
  d_q = jnp.einsum('bhts,bshd->bthd', d_scores, k, preferred_element_type=F32) * scale
  d_k = jnp.einsum('bhts,bthd->bshd', d_scores, q, preferred_element_type=F32) * scale
  return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None


_attend.defvjp(_attend_fwd, _attend_bwd)


def xla_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, q_segments: jax.Array | None = None, kv_segments: jax.Array | None = None
) -> jax.Array:
  """q, k, v [B, T, H, Dh] -> [B, T, H, Dh], fp32 scores, the backward of _attend_bwd; no mask without segments."""
  return _attend(q, k, v, None if q_segments is None else allowed(q_segments, kv_segments))
