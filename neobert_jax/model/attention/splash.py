"""TPU flash attention: Pallas splash attention with segment ids (every head a FullMask; padding keeps its own id, so
no row is fully masked), run per shard inside shard_map with specs from the logical-axis rules. The kernel is
chosen where the program is lowered (lax.platform_dependent), so an AOT compile for TPU on a CPU host gets Mosaic,
not the interpreter the tests run."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from neobert_jax import sharding as shd


def _kernel(num_heads: int, seq_len: int, block: int, interpret: bool):
  block = min(block, seq_len)
  tiles = [f.name for f in dataclasses.fields(splash.BlockSizes) if f.name.startswith('block_')]  # fwd, dkv, dq
  sizes = splash.BlockSizes(**dict.fromkeys(tiles, block))
  mask = splash_mask.MultiHeadMask([splash_mask.FullMask((seq_len, seq_len))] * num_heads)
  return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _local(q, k, v, q_seg, kv_seg, *, block: int, interpret: bool):
  """One shard: [b, T, h, Dh] -> [b, T, h, Dh]; the kernel wants [h, T, Dh] per example, so vmap over b."""
  b, t, h, d = q.shape
  kernel = _kernel(h, t, block, interpret)
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)
  q = heads_major(q * jnp.asarray(d**-0.5, q.dtype))  # splash does not scale the scores itself
  k, v = heads_major(k), heads_major(v)

  def one(q1, k1, v1, qs, ks):  # one example; no segment ids (None): no mask
    return kernel(q1, k1, v1, segment_ids=None if qs is None else splash.SegmentIds(q=qs, kv=ks))

  return heads_major(jax.vmap(one)(q, k, v, q_seg, kv_seg))


def splash_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_segments: jax.Array | None = None,
  kv_segments: jax.Array | None = None,
  *,
  block_size: int = 512,
) -> jax.Array:
  """q, k, v [B, T, H, Dh] -> [B, T, H, Dh]; segments per reference.py's convention (None: no mask). The Mosaic
  kernel where the program is lowered for TPU, interpret mode elsewhere."""
  if q_segments is not None:
    # Splash attends iff the ids are equal (reference.py also requires kv > 0). Padding queries take the id of their own
    # key (0), so they attend other padding instead of nothing: a row with no live query (an all-padding row) still has
    # a valid softmax and finite gradients. Only padding outputs differ from reference.py, and nothing reads them.
    kv_segments = kv_segments.astype(jnp.int32)
    q_segments = jnp.where(kv_segments > 0, q_segments.astype(jnp.int32), 0)
  kernel, emulated = (functools.partial(_local, block=int(block_size), interpret=i) for i in (False, True))
  fn = lambda *args: jax.lax.platform_dependent(*args, tpu=kernel, default=emulated)
  qkv = ('batch', 'length', 'heads', 'head_dim')
  if q_segments is None:
    return shd.per_shard(lambda q, k, v: fn(q, k, v, None, None), (q, k, v), (qkv,) * 3, qkv)
  rows = ('batch', 'length')
  return shd.per_shard(fn, (q, k, v, q_segments, kv_segments), (qkv,) * 3 + (rows,) * 2, qkv)
