"""cuDNN attention on a real GPU against the XLA path, in bf16: logits and gradients of the whole model.

Skipped without a GPU. On a GPU machine (conftest defaults JAX_PLATFORMS to cpu, so say cuda explicitly):

    JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/test_model_attention_gpu.py

The packed-layout kernel needs Hopper (sm90+); the padding and bias kernels run on any cuDNN GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from neobert_jax.model import NeoBERTForMLM, default_model_config

pytestmark = [
  pytest.mark.gpu,
  pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs an NVIDIA GPU (JAX_PLATFORMS=cuda)'),
]

B, T = 4, 512


def _hopper() -> bool:
  cap = getattr(jax.devices()[0], 'compute_capability', '0.0')
  return tuple(int(x) for x in cap.split('.')) >= (9, 0)


def _segments():
  seg = np.zeros((B, T), np.int32)
  seg[0, :200], seg[0, 200:230], seg[0, 230:500] = 1, 2, 3  # three documents and padding
  seg[1, :] = 1  # one full row
  bounds = np.linspace(0, T, 17).astype(int)  # 16 documents: the default per-row maximum
  for d in range(16):
    seg[3, bounds[d] : bounds[d + 1]] = d + 1  # row 2 stays all padding
  return seg


def _run(kernel: str, masking: str):
  cfg = default_model_config()
  cfg.update(
    num_layers=2,
    hidden_size=768,
    num_heads=12,
    intermediate_size=3072,
    vocab_size=1024,
    max_length=T,
    dtype='bfloat16',
    attention_impl=kernel,
  )
  seg = jnp.asarray(_segments())
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 1024, (B, T)), jnp.int32) * (seg > 0)
  kw = {'segment_ids': seg, 'max_segments': 16} if masking == 'packed' else {'lengths': (seg > 0).sum(-1)}
  weight = (seg > 0).astype(jnp.float32)

  @jax.jit
  def run():
    model = NeoBERTForMLM(cfg, rngs=nnx.Rngs(0))

    def loss(m):
      logits = m(ids, **kw)
      return jnp.sum(-jax.nn.log_softmax(logits)[..., 7] * weight) / weight.sum(), logits

    (_, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
    return logits, nnx.to_pure_dict(grads)

  return run()


def _check(kernel, masking):
  logits, grads = _run(kernel, masking)
  ref_logits, ref_grads = _run('xla', masking)
  live = np.asarray(_segments() > 0)  # real tokens (padded rows put them first too)
  # bf16 compute: both sides round differently; compare at bf16-level tolerances, relative to the scale
  np.testing.assert_allclose(np.asarray(logits)[live], np.asarray(ref_logits)[live], atol=5e-2, rtol=5e-2)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
    assert np.all(np.isfinite(g))
    assert np.linalg.norm(g - r) <= 3e-2 * np.linalg.norm(r) + 1e-6


def test_cudnn_packed_layout_matches_xla_in_bf16():
  if not _hopper():
    pytest.skip('the packed layout needs Hopper')
  _check('cudnn', 'packed')


def test_cudnn_bias_kernel_matches_xla_in_bf16():
  _check('cudnn_bias', 'packed')


def test_cudnn_padding_kernel_matches_xla_in_bf16():
  _check('cudnn', 'padded')
