"""RMSNorm, SwiGLU and RoPE with hand-written gradients.

Why: under autodiff each saves its fp32 intermediates, and in the layer scan every saved value is a [layers, B, T,
width] buffer; on the 250M H100 step that traffic was over half the step (docs/performance.md, "Roofline"). These
save only the input (plus one fp32 scalar per token for RMSNorm) and recompute the rest in the backward pass.
Forwards are bit-identical to the plain expressions; backwards are exact derivatives in fp32."""

from functools import partial

import jax
import jax.numpy as jnp


def _rms_forward(x: jax.Array, scale: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
  x32 = x.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return ((x32 * inv) * scale.astype(jnp.float32)).astype(x.dtype), inv


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm computed in fp32 whatever the activation dtype, returned in the activation dtype."""
  return _rms_forward(x, scale, eps)[0]


def _rms_fwd(x, scale, eps):
  out, inv = _rms_forward(x, scale, eps)
  return out, (x, scale, inv)


def _rms_bwd(eps, residuals, g):
  del eps
  x, scale, inv = residuals
  normed = x.astype(jnp.float32) * inv
  g32 = g.astype(jnp.float32)
  d_scale = jnp.sum(g32 * normed, axis=tuple(range(g.ndim - 1))).astype(scale.dtype)
  gn = g32 * scale.astype(jnp.float32)
  # d/dx of x * (mean(x^2) + eps)^-1/2: inv * (gn - normed * mean(gn * normed))
  dx = inv * (gn - normed * jnp.mean(gn * normed, axis=-1, keepdims=True))
  return dx.astype(x.dtype), d_scale


rms_norm.defvjp(_rms_fwd, _rms_bwd)


def swiglu_autodiff(gate_up: jax.Array) -> jax.Array:
  """[..., 2, F] (gate, up) -> silu(gate) * up, in the input's dtype; gradient by autodiff."""
  return jax.nn.silu(gate_up[..., 0, :]) * gate_up[..., 1, :]


@jax.custom_vjp
def swiglu(gate_up: jax.Array) -> jax.Array:
  """swiglu_autodiff's value with a backward pass that saves only gate_up."""
  return swiglu_autodiff(gate_up)


def _swiglu_bwd(gate_up, g):
  # One elementwise pass over [..., 2, F]: each slot reads its partner (the other half, reversed along the slot
  # axis) so that gate and up gradients come out of one kernel with one sigmoid per element; written with a
  # stack, XLA put the sigmoid in a kernel of its own and wrote it to memory in fp32.
  x = gate_up.astype(jnp.float32)
  partner = x[..., ::-1, :]
  is_gate = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 2) == 0
  gate, up = jnp.where(is_gate, x, partner), jnp.where(is_gate, partner, x)
  sig = jax.nn.sigmoid(gate)
  g32 = jnp.expand_dims(g.astype(jnp.float32), -2)
  # silu'(a) = s + a s (1 - s) for the gate, silu(a) for the up projection
  d = jnp.where(is_gate, up * sig * (1.0 + gate * (1.0 - sig)), gate * sig)
  return ((g32 * d).astype(gate_up.dtype),)


swiglu.defvjp(lambda gate_up: (swiglu(gate_up), gate_up), _swiglu_bwd)


def rotate_pairs(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Adjacent pairs (x[2i], x[2i+1]) of x [B, T, H, Dh] rotated by angles with cos / sin [B, T, 1, Dh/2], in
  fp32, returned in x's dtype."""
  *lead, dh = x.shape
  pairs = x.astype(jnp.float32).reshape(*lead, dh // 2, 2)
  real, imag = pairs[..., 0], pairs[..., 1]
  rotated = jnp.stack([real * cos - imag * sin, real * sin + imag * cos], axis=-1)
  return rotated.reshape(x.shape).astype(x.dtype)


@jax.custom_vjp
def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """rotate_pairs whose gradient is the inverse rotation (a rotation is orthogonal), so nothing but the angles is
  saved. The angles come from integer positions: they get no gradient."""
  return rotate_pairs(x, cos, sin)


def _rotate_bwd(residuals, g):
  cos, sin = residuals
  return rotate_pairs(g, cos, -sin), jnp.zeros_like(cos), jnp.zeros_like(sin)


rotate.defvjp(lambda x, cos, sin: (rotate_pairs(x, cos, sin), (cos, sin)), _rotate_bwd)


def _einsum_f32(spec: str, a: jax.Array, b: jax.Array, out_dtype: jnp.dtype) -> jax.Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32).astype(out_dtype)


@partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def einsum_accumulating(spec: str, a: jax.Array, b: jax.Array, out_dtype: jnp.dtype | None = None) -> jax.Array:
  """jnp.einsum(spec, a, b) accumulated in fp32 and written in out_dtype (default a's); the backward pass's two
  contractions take the cotangent in a's dtype and accumulate in fp32 too: a bfloat16 einsum's numbers on GPU and
  TPU, in the bfloat16-in, fp32-out dots XLA:CPU runs natively (model.dots)."""
  return _einsum_f32(spec, a, b, out_dtype or a.dtype)


def _einsum_bwd(spec, out_dtype, residuals, g):
  (a, b), (sa, sb, out) = residuals, spec.replace('->', ',').split(',')
  g = g.astype(a.dtype)
  return _einsum_f32(f'{out},{sb}->{sa}', g, b, a.dtype), _einsum_f32(f'{sa},{out}->{sb}', a, g, b.dtype)


einsum_accumulating.defvjp(lambda spec, a, b, dtype: (einsum_accumulating(spec, a, b, dtype), (a, b)), _einsum_bwd)
