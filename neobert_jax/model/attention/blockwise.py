"""Blockwise (flash-style) attention in plain JAX, the portable fallback: online softmax over key blocks, never a
[B, H, T, S] tensor; the backward pass recomputes each block from the saved log-sum-exp (FlashAttention-2's recipe).
Statistics and accumulators are fp32; matmul inputs keep the activation dtype."""

import functools

import jax
import jax.numpy as jnp

from neobert_jax.model.attention.reference import MASKED_SCORE, allowed


def _blocks(x: jax.Array, block: int) -> jax.Array:
  """[B, H, S, ...] -> [S / block, B, H, block, ...], the scan axis first."""
  b, h, s = x.shape[:3]
  x = x.reshape((b, h, s // block, block) + x.shape[3:])
  return jnp.moveaxis(x, 2, 0)


def _unblock(x: jax.Array) -> jax.Array:
  """Inverse of _blocks."""
  n, b, h, blk = x.shape[:4]
  return jnp.moveaxis(x, 0, 2).reshape((b, h, n * blk) + x.shape[4:])


def _key_blocks(k, v, kv_seg, block):
  """Keys, values and key segments cut into scan-ready blocks; S is padded up to a multiple of block with keys
  of segment 0 (never attended). Returns ([n, B, H, block, D], [n, B, H, block, D], [n, B, block])."""
  if pad := -k.shape[2] % block:
    k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k, v))
    kv_seg = jnp.pad(kv_seg, ((0, 0), (0, pad)))
  segments = jnp.moveaxis(kv_seg.reshape(kv_seg.shape[0], -1, block), 1, 0)
  return _blocks(k, block), _blocks(v, block), segments


def _scores(qh, kj, q_seg, sj, scale):
  """One block's masked fp32 scores [B, H, T, block] and the boolean mask that produced them."""
  s = jnp.einsum('bhtd,bhsd->bhts', qh, kj, preferred_element_type=jnp.float32) * scale
  ok = allowed(q_seg, sj)
  return jnp.where(ok, s, MASKED_SCORE), ok


def _forward(qh, kh, vh, q_seg, kv_seg, block):
  """Heads-major inputs [B, H, T|S, D]; returns (out [B, H, T, D] in v's dtype, lse [B, H, T] fp32)."""
  b, h, t, d = qh.shape
  scale = d**-0.5

  def step(carry, xs):
    m, l, acc = carry
    kj, vj, sj = xs
    s, ok = _scores(qh, kj, q_seg, sj, scale)
    m_new = jnp.maximum(m, s.max(-1))
    # Zeroing masked entries explicitly keeps a row that has seen only masked keys at exactly zero weight.
    p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
    correction = jnp.exp(m - m_new)
    l = l * correction + p.sum(-1)
    pv = jnp.einsum('bhts,bhsd->bhtd', p.astype(vj.dtype), vj, preferred_element_type=jnp.float32)
    return (m_new, l, acc * correction[..., None] + pv), None

  init = (
    jnp.full((b, h, t), MASKED_SCORE, jnp.float32),
    jnp.zeros((b, h, t), jnp.float32),
    jnp.zeros((b, h, t, d), jnp.float32),
  )
  (m, l, acc), _ = jax.lax.scan(step, init, _key_blocks(kh, vh, kv_seg, block))
  live = l > 0
  out = acc / jnp.where(live, l, 1.0)[..., None]
  # A query with no allowed key gets lse = +inf, so the backward pass gives it zero probability everywhere.
  lse = jnp.where(live, m + jnp.log(jnp.where(live, l, 1.0)), jnp.inf)
  return out.astype(vh.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention_heads_major(qh, kh, vh, q_seg, kv_seg, block):
  return _forward(qh, kh, vh, q_seg, kv_seg, block)[0]


def _vjp_fwd(qh, kh, vh, q_seg, kv_seg, block):
  out, lse = _forward(qh, kh, vh, q_seg, kv_seg, block)
  return out, (qh, kh, vh, q_seg, kv_seg, out, lse)


def _vjp_bwd(block, residuals, dout):
  qh, kh, vh, q_seg, kv_seg, out, lse = residuals
  b, h, t, d = qh.shape
  s_len = kh.shape[2]
  scale = d**-0.5
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # rowsum(dO * O) [B, H, T]

  def step(dq, xs):
    kj, vj, sj = xs
    s, _ = _scores(qh, kj, q_seg, sj, scale)
    p = jnp.exp(s - lse[..., None])
    dv = jnp.einsum('bhts,bhtd->bhsd', p.astype(dout.dtype), dout, preferred_element_type=jnp.float32)
    dp = jnp.einsum('bhtd,bhsd->bhts', dout, vj, preferred_element_type=jnp.float32)
    ds = (p * (dp - delta[..., None])).astype(qh.dtype)
    dq = dq + jnp.einsum('bhts,bhsd->bhtd', ds, kj, preferred_element_type=jnp.float32)
    dk = jnp.einsum('bhts,bhtd->bhsd', ds, qh, preferred_element_type=jnp.float32)
    return dq, (dk, dv)

  dq, (dk, dv) = jax.lax.scan(step, jnp.zeros((b, h, t, d), jnp.float32), _key_blocks(kh, vh, kv_seg, block))
  dk, dv = _unblock(dk)[:, :, :s_len], _unblock(dv)[:, :, :s_len]
  # segment ids are integers: no cotangent
  return (dq * scale).astype(qh.dtype), (dk * scale).astype(kh.dtype), dv.astype(vh.dtype), None, None


_attention_heads_major.defvjp(_vjp_fwd, _vjp_bwd)


def blockwise_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_segments: jax.Array | None = None,
  kv_segments: jax.Array | None = None,
  *,
  block_size: int = 128,
) -> jax.Array:
  """q, k, v [B, T, H, Dh] -> [B, T, H, Dh], the same function as reference.xla_attention on live queries."""
  if q_segments is None:  # no mask: one segment everywhere
    q_segments, kv_segments = jnp.ones(q.shape[:2], jnp.int32), jnp.ones(k.shape[:2], jnp.int32)
  block = max(1, min(int(block_size), k.shape[1]))
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)
  out = _attention_heads_major(
    heads_major(q), heads_major(k), heads_major(v), q_segments.astype(jnp.int32), kv_segments.astype(jnp.int32), block
  )
  return heads_major(out)
