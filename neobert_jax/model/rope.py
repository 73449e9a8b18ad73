"""Rotary position embeddings in NeoBERT's convention: ADJACENT pairs (x[2i], x[2i+1]) rotate as complex numbers.

Positions are an input rather than implied by the row index, so a packed row restarts at 0 for every document.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def inverse_frequencies(head_dim: int, theta: float) -> jax.Array:
  return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotates x [B, T, H, Dh] by angles positions [B, T] x inverse frequencies, in fp32, returning x's dtype."""
  *lead, dh = x.shape
  angles = positions.astype(jnp.float32)[..., None] * inverse_frequencies(dh, theta)  # [B, T, Dh/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  pairs = x.astype(jnp.float32).reshape(*lead, dh // 2, 2)
  real, imag = pairs[..., 0], pairs[..., 1]
  rotated = jnp.stack([real * cos - imag * sin, real * sin + imag * cos], axis=-1)
  return rotated.reshape(x.shape).astype(x.dtype)
