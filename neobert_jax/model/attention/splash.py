"""TPU flash attention: Pallas splash attention with segment ids, run per shard inside shard_map.

NeoBERT is bidirectional, so every head uses a FullMask and documents are kept apart by segment ids alone (a
query attends a key iff their ids are equal). Padding keeps its own id (0 in a packed row, 0 after the length in
a padded row), so no query row is ever fully masked. The kernel is built per shard for the local head count;
shard_map's specs come from the trainer's logical-axis rules (batch over data x fsdp, heads over tensor), so
changing the mesh never touches this file. Off TPU the same kernel runs in Pallas interpret mode (tests).

Which of the two is chosen where the program is lowered (lax.platform_dependent), not from the process's default
backend: an ahead-of-time compile for a TPU target runs on a CPU process, and must get the Mosaic kernel, not an
interpreted emulation of it.

Owns: the splash call and its sharding. Block sizes are validated in config/model.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from neobert_jax import sharding as shd


def _kernel(num_heads: int, seq_len: int, block: int, interpret: bool):
  block = min(block, seq_len)
  sizes = splash.BlockSizes(
    block_q=block,
    block_kv=block,
    block_kv_compute=block,
    block_q_dkv=block,
    block_kv_dkv=block,
    block_kv_dkv_compute=block,
    block_q_dq=block,
    block_kv_dq=block,
  )
  mask = splash_mask.MultiHeadMask([splash_mask.FullMask((seq_len, seq_len))] * num_heads)
  return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _local(q, k, v, q_seg, kv_seg, *, block: int, interpret: bool):
  """One shard: [b, T, h, Dh] -> [b, T, h, Dh]; the kernel wants [h, T, Dh] per example, so vmap over b."""
  b, t, h, d = q.shape
  kernel = _kernel(h, t, block, interpret)
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)
  q = heads_major(q * jnp.asarray(d**-0.5, q.dtype))  # splash does not scale the scores itself
  k, v = heads_major(k), heads_major(v)
  if q_seg is None:
    out = jax.vmap(kernel)(q, k, v)
  else:
    out = jax.vmap(lambda q1, k1, v1, qs, ks: kernel(q1, k1, v1, segment_ids=splash.SegmentIds(q=qs, kv=ks)))(
      q, k, v, q_seg, kv_seg
    )
  return heads_major(out)


def splash_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_segments: jax.Array | None = None,
  kv_segments: jax.Array | None = None,
  *,
  block_size: int = 512,
  interpret: bool | None = None,
) -> jax.Array:
  """q, k, v [B, T, H, Dh] -> [B, T, H, Dh]; segments per reference.py's convention (None: no mask). interpret:
  None picks the Mosaic kernel where the program is lowered for TPU and interpret mode elsewhere."""
  if q_segments is not None:
    # Splash attends iff the ids are equal (reference.py also requires kv > 0). Padding queries take the id of
    # their own key (0), so they attend other padding instead of nothing: a row with no live query (an all-padding
    # row) still has a valid softmax and finite gradients. Only padding outputs differ from reference.py, and
    # nothing reads them.
    kv_segments = kv_segments.astype(jnp.int32)
    q_segments = jnp.where(kv_segments > 0, q_segments.astype(jnp.int32), 0)
  if interpret is None:
    kernel, emulated = (functools.partial(_local, block=int(block_size), interpret=i) for i in (False, True))
    fn = lambda *args: jax.lax.platform_dependent(*args, tpu=kernel, default=emulated)
  else:
    fn = functools.partial(_local, block=int(block_size), interpret=bool(interpret))
  qkv = ('batch', 'length', 'heads', 'head_dim')
  if q_segments is None:
    return shd.per_shard(lambda q, k, v: fn(q, k, v, None, None), (q, k, v), (qkv,) * 3, qkv)
  rows = ('batch', 'length')
  return shd.per_shard(fn, (q, k, v, q_segments, kv_segments), (qkv,) * 3 + (rows,) * 2, qkv)
