"""Rotary position embeddings in NeoBERT's convention: ADJACENT pairs (x[2i], x[2i+1]) rotate as complex numbers.

Positions are an input rather than implied by the row index, so a packed row restarts at 0 for every document.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from neobert_jax.model.fused import rotate


def inverse_frequencies(head_dim: int, theta: float) -> jax.Array:
  return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotates x [B, T, H, Dh] by positions x inverse frequencies in fp32; the backward keeps only the angles."""
  angles = positions.astype(jnp.float32)[..., None] * inverse_frequencies(x.shape[-1], theta)  # [B, T, Dh/2]
  return rotate(x, jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :])
