"""The plain masked attention every kernel is tested against, written apart from the package's kernels: 4-D einsums,
fp32 scores, gradients by autodiff. Only the mask convention (reference.allowed) is the package's."""

import jax
import jax.numpy as jnp

from neobert_jax.model.attention.reference import MASKED_SCORE, allowed


def plain_attention(q, k, v, q_segments=None, kv_segments=None):
  """q, k, v [B, T, H, Dh] -> [B, T, H, Dh] in v's dtype; the P.V dot accumulates in fp32, as every kernel's."""
  scores = jnp.einsum('bthd,bshd->bhts', q, k, preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5
  if q_segments is not None:
    scores = jnp.where(allowed(q_segments, kv_segments), scores, MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('bhts,bshd->bthd', probs, v, preferred_element_type=jnp.float32).astype(v.dtype)
