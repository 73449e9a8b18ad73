"""cuDNN's packed (ragged) layout from segment ids: per-row `seqlens` [B, M] and `offsets` [B, M + 1] (unused -1) for a
static M (data.max_documents_per_row); `overflow` reports a row with more documents, so the trainer stops with the
setting's name instead of silently dropping documents."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def packed_layout(segment_ids: jax.Array, max_segments: int) -> tuple[jax.Array, jax.Array]:
  """[B, T] segment ids -> (seqlens [B, M] int32, offsets [B, M + 1] int32), -1 where a slot is unused."""
  seg = segment_ids.astype(jnp.int32)
  t = seg.shape[1]
  slots = jnp.arange(1, max_segments + 1, dtype=jnp.int32)
  member = seg[:, :, None] == slots[None, None, :]  # [B, T, M]
  lengths = member.sum(axis=1, dtype=jnp.int32)
  positions = jnp.arange(t, dtype=jnp.int32)[None, :, None]
  starts = jnp.min(jnp.where(member, positions, t), axis=1)  # first token of each document
  used = lengths > 0
  seqlens = jnp.where(used, lengths, -1)
  offsets = jnp.where(used, starts, -1)
  offsets = jnp.concatenate([offsets, jnp.full((seg.shape[0], 1), -1, jnp.int32)], axis=1)
  return seqlens, offsets


def overflow(segment_ids: jax.Array, max_segments: int) -> jax.Array:
  """Number of rows holding a document beyond slot max_segments (0 when the layout is exact)."""
  return jnp.sum(jnp.max(segment_ids, axis=1) > max_segments).astype(jnp.int32)
