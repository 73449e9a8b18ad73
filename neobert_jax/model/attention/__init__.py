"""Bidirectional attention for three masking modes (none, padded lengths, packed segment ids), dispatched to one
kernel per backend: 'xla' (reference.py), 'blockwise', 'cudnn' (packed rows through jax_compat), 'cudnn_bias' and
'splash' (TPU). config/model.choose_attention decides what 'auto' means; every kernel is tested against
tests/support/attention_reference.py."""

import jax
import jax.numpy as jnp

from neobert_jax import jax_compat
from neobert_jax import sharding as shd
from neobert_jax.model.attention.blockwise import blockwise_attention
from neobert_jax.model.attention.reference import allowed, segments_from_lengths, xla_attention
from neobert_jax.config.model import KERNELS

__all__ = ['KERNELS', 'attention', 'overflow', 'packed_layout']


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
  offsets = jnp.pad(jnp.where(used, starts, -1), ((0, 0), (0, 1)), constant_values=-1)
  return jnp.where(used, lengths, -1), offsets


def overflow(segment_ids: jax.Array, max_segments: int) -> jax.Array:
  """Number of rows holding a document beyond slot max_segments (0 when the layout is exact)."""
  return jnp.sum(jnp.max(segment_ids, axis=1) > max_segments).astype(jnp.int32)


def _cudnn_local(q, k, v, segment_ids, lengths, kernel, max_segments):
  if segment_ids is not None and kernel == 'cudnn':
    seqlens, offsets = packed_layout(segment_ids, max_segments)
    return jax_compat.cudnn_packed_flash_attention(q, k, v, seqlens, offsets)
  mask = None if segment_ids is None else allowed(segment_ids, segment_ids)
  return jax.nn.dot_product_attention(
    q, k, v, mask=mask, query_seq_lengths=lengths, key_value_seq_lengths=lengths, implementation='cudnn'
  )


def _cudnn(q, k, v, segment_ids, lengths, kernel, max_segments):
  """cuDNN fused attention on each device's rows and heads (sharding.per_shard, as splash): every row and head is
  independent, and jax's own partitioning of the cuDNN call fails inside the gradient accumulation's shard_map."""
  if segment_ids is not None and kernel == 'cudnn' and max_segments is None:
    raise ValueError('cuDNN packed attention needs max_segments (data.max_documents_per_row).')
  if segment_ids is not None and kernel != 'cudnn' and q.shape[1] % 2:
    raise ValueError(f"cuDNN's bias kernel needs an even sequence length, got {q.shape[1]}.")
  qkv = ('batch', 'length', 'heads', 'head_dim')
  local = lambda q, k, v, seg=None, lens=None: _cudnn_local(q, k, v, seg, lens, kernel, max_segments)
  if segment_ids is not None:
    return shd.per_shard(local, (q, k, v, segment_ids), (qkv,) * 3 + (('batch', 'length'),), qkv)
  if lengths is not None:
    rows = lambda q, k, v, lens: local(q, k, v, lens=lens)
    return shd.per_shard(rows, (q, k, v, lengths.astype(jnp.int32)), (qkv,) * 3 + (('batch',),), qkv)
  return shd.per_shard(local, (q, k, v), (qkv,) * 3, qkv)


def attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  *,
  segment_ids: jax.Array | None = None,
  lengths: jax.Array | None = None,
  kernel: str = 'xla',
  max_segments: int | None = None,
  block_size: int | None = None,
) -> jax.Array:
  """q, k, v [B, T, H, Dh] -> [B, T, H, Dh], with segment_ids (packed), lengths (padded) or neither; no 'auto'."""
  if segment_ids is not None and lengths is not None:
    raise ValueError('pass segment_ids (packed rows) or lengths (padded rows), not both.')
  if kernel in ('cudnn', 'cudnn_bias'):
    return _cudnn(q, k, v, segment_ids, lengths, kernel, max_segments)
  if segment_ids is not None:
    q_seg = kv_seg = segment_ids.astype(jnp.int32)
  elif lengths is not None:
    q_seg, kv_seg = segments_from_lengths(lengths, k.shape[1])
  else:
    q_seg = kv_seg = None
  if kernel == 'xla':
    return xla_attention(q, k, v, q_seg, kv_seg)
  tile = {} if block_size is None else {'block_size': int(block_size)}
  if kernel == 'blockwise':
    return blockwise_attention(q, k, v, q_seg, kv_seg, **tile)
  if kernel == 'splash':
    from neobert_jax.model.attention.splash import splash_attention  # Pallas import only when used

    return splash_attention(q, k, v, q_seg, kv_seg, **tile)
  raise ValueError(f'unknown attention kernel {kernel!r}; expected one of {KERNELS}.')
