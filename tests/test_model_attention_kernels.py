"""Every attention kernel against the plain masked einsum with autodiff gradients (tests/support/attention_reference.py),
the packed layout against brute force, the documents-per-row cap in packing, and the 'auto' table.

Outputs at padding positions are unspecified in every kernel (nothing reads them), so outputs are compared on
real tokens and gradients flow from a loss over real tokens only; everything must be finite everywhere.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from neobert_jax import sharding
from neobert_jax.data.pipeline import packing
from neobert_jax.model import NeoBERTForMLM, default_model_config
from neobert_jax.config.model import choose_attention
from neobert_jax.model.attention import attention, overflow, packed_layout
from tests.support.attention_reference import plain_attention

B, T, H, D = 4, 256, 2, 32


def _segments(max_docs=4):
  """Row 0: three documents and padding; row 1: one full document; row 2: only padding; row 3: max_docs docs."""
  seg = np.zeros((B, T), np.int32)
  seg[0, :100], seg[0, 100:130], seg[0, 130:250] = 1, 2, 3
  seg[1, :] = 1
  bounds = np.linspace(0, T, max_docs + 1).astype(int)
  for d in range(max_docs):
    seg[3, bounds[d] : bounds[d + 1]] = d + 1
  return seg


MODES = {
  'packed': lambda: ({'segment_ids': jnp.asarray(_segments())}, _segments() > 0),
  'padded': lambda: (
    {'lengths': jnp.asarray([200, T, 0, 17])},
    np.arange(T)[None] < np.array([200, T, 0, 17])[:, None],
  ),
  'none': lambda: ({}, np.ones((B, T), bool)),
}


def _qkv(dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v = (jax.random.normal(key, (B, T, H, D), dtype) for key in keys[:3])
  return q, k, v, jax.random.normal(keys[3], (B, T, H, D), jnp.float32)


def _plain(q, k, v, segment_ids=None, lengths=None):
  """plain_attention under attention()'s masking arguments."""
  if lengths is not None:
    real = (jnp.arange(q.shape[1])[None] < lengths[:, None]).astype(jnp.int32)
    return plain_attention(q, k, v, jnp.ones_like(real), real)
  return plain_attention(q, k, v, segment_ids, segment_ids)


def _grads(f, cot, inputs):
  """d/d(q, k, v) of sum(f(q, k, v) * cot), in the inputs' dtype."""
  return jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * cot), argnums=(0, 1, 2))(*inputs)


def _compare(kernel, mode, atol, block_size=None, **kw):
  masking, live = MODES[mode]()
  live = jnp.asarray(live)[:, :, None, None]
  q, k, v, cot = _qkv()
  cot = cot * live

  kernel_fn = lambda *a: attention(*a, kernel=kernel, block_size=block_size, **masking, **kw)
  out, grads = kernel_fn(q, k, v), _grads(kernel_fn, cot, (q, k, v))
  ref_out, ref_grads = _plain(q, k, v, **masking), _grads(lambda *a: _plain(*a, **masking), cot, (q, k, v))
  assert bool(jnp.isfinite(out).all()) and all(bool(jnp.isfinite(g).all()) for g in grads)
  np.testing.assert_allclose(out * live, ref_out * live, atol=atol)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=atol)


@pytest.mark.parametrize('mode', MODES)
def test_xla_kernel_matches_autodiff(mode):
  """The 'xla' kernel's hand-written backward (probabilities saved, rowsum(dO * O)) against autodiff, in fp32."""
  _compare('xla', mode, atol=1e-5)


def test_xla_kernel_bfloat16_gradients_near_autodiff():
  """In bfloat16 its dS enters the dots in bfloat16 (as FlashAttention's): its gradients' RMS error against fp32
  autodiff on the same (rounded) inputs stays within 1.25x autodiff's own in bfloat16 (1.17x and 1.12x for dQ and
  dK; 1.34x and 1.26x with the row sum taken from the output rounded to bfloat16). Queries x3: sharper attention."""
  masking, live = MODES['packed']()
  q, k, v, cot = _qkv()
  rounded = [x.astype(jnp.bfloat16) for x in (3 * q, k, v)]
  cot = cot * jnp.asarray(live)[:, :, None, None]
  kernel = _grads(lambda *a: attention(*a, kernel='xla', **masking), cot, rounded)
  autodiff = _grads(lambda *a: _plain(*a, **masking), cot, rounded)
  truth = _grads(lambda *a: _plain(*a, **masking), cot, [x.astype(jnp.float32) for x in rounded])
  assert all(g.dtype == jnp.bfloat16 for g in kernel)
  np.testing.assert_array_equal(attention(*rounded, kernel='xla', **masking), _plain(*rounded, **masking))
  error = lambda g, t: np.sqrt(np.mean((np.asarray(g, np.float32) - t) ** 2) / np.mean(t**2))
  for g, a, t in zip(kernel, autodiff, truth):
    assert error(g, t) <= 1.25 * error(a, t)


@pytest.mark.slow
@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('block', [64, 100])
def test_blockwise_matches_reference(mode, block):
  # 100 does not divide T: the last key block is padded with never-attended keys.
  _compare('blockwise', mode, atol=1e-5, block_size=block)


# Packed rows in Pallas interpret mode take 6.5 s on 2 cores: in the full suite, not the fast subset.
@pytest.mark.parametrize('mode', [pytest.param(m, marks=pytest.mark.slow) if m == 'packed' else m for m in MODES])
def test_splash_interpret_matches_reference(mode):
  _compare('splash', mode, atol=1e-5, block_size=128)


def test_kernels_fail_without_the_mask():
  """The comparison can fail: a packed row run as if unmasked differs from the masked reference."""
  q, k, v, _ = _qkv()
  seg = jnp.asarray(_segments())
  masked = attention(q, k, v, kernel='xla', segment_ids=seg)
  unmasked = attention(q, k, v, kernel='blockwise', block_size=64)
  live = jnp.asarray(_segments() > 0)[:, :, None, None]
  assert float(jnp.max(jnp.abs((masked - unmasked) * live))) > 1e-2


def _brute_layout(seg, max_segments):
  b = seg.shape[0]
  lens = -np.ones((b, max_segments), np.int32)
  offs = -np.ones((b, max_segments + 1), np.int32)
  for r in range(b):
    for d in range(1, max_segments + 1):
      where = np.nonzero(seg[r] == d)[0]
      if where.size:
        lens[r, d - 1], offs[r, d - 1] = where.size, where[0]
  return lens, offs


def test_packed_layout_matches_brute_force_and_reports_overflow():
  seg = _segments(max_docs=4)
  lens, offs = packed_layout(jnp.asarray(seg), 4)
  want_lens, want_offs = _brute_layout(seg, 4)
  np.testing.assert_array_equal(lens, want_lens)
  np.testing.assert_array_equal(offs, want_offs)
  assert lens[2].tolist() == [-1] * 4 and lens[3].tolist() == [64] * 4  # all padding; exactly at the maximum
  assert int(overflow(jnp.asarray(seg), 4)) == 0
  # Row 3 holds 4 documents: with room for 3 its fourth cannot be represented, and that is reported.
  lens3, _ = packed_layout(jnp.asarray(seg), 3)
  assert int(jnp.sum(lens3[3])) == 192 and int(overflow(jnp.asarray(seg), 3)) == 1


def test_packing_closes_rows_at_the_document_limit():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 12, 300)
  tokens = rng.integers(5, 100, int(lengths.sum())).astype(np.int32)
  free = packing.pack_block(tokens, lengths, 128, 'packed', 0)
  capped = packing.pack_block(tokens, lengths, 128, 'packed', 0, max_docs=5)
  assert free['segment_ids'].max() > 5  # the limit binds on this block
  assert capped['segment_ids'].max() == 5
  assert int((capped['segment_ids'] > 0).sum()) == int(lengths.sum())  # no token lost, only more rows
  assert capped['segment_ids'].shape[0] > free['segment_ids'].shape[0]


@functools.lru_cache(maxsize=None)
def _model_logits_and_grads(kernel, mesh_sizes=None):
  cfg = default_model_config()
  cfg.update(
    num_layers=1,
    hidden_size=64,
    num_heads=4,
    intermediate_size=192,
    vocab_size=128,
    max_length=T,
    attention_impl=kernel,
    splash_block_size=128,
    blockwise_block_size=64,
  )
  seg = jnp.asarray(_segments())
  ids = jnp.asarray(np.random.default_rng(1).integers(1, 128, (B, T)), jnp.int32) * (seg > 0)
  labels_weight = (seg > 0).astype(jnp.float32)

  def loss(model):
    logits = model(ids, segment_ids=seg)
    ce = -jax.nn.log_softmax(logits)[..., 5]
    return jnp.sum(ce * labels_weight), logits

  def run():
    model = NeoBERTForMLM(cfg, rngs=nnx.Rngs(0))
    (_, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
    return logits, nnx.to_pure_dict(grads)

  if mesh_sizes is None:
    return jax.jit(run)()
  mesh = sharding.make_mesh(dict(mesh_sizes), jax.devices()[:4])
  with sharding.activate(mesh):
    return jax.jit(run)()


@pytest.mark.slow
@pytest.mark.parametrize(
  'kernel,mesh', [('blockwise', None), ('splash', None), ('splash', (('data', 1), ('fsdp', 2), ('tensor', 2)))]
)
def test_kernels_inside_the_model(kernel, mesh):
  """Logits and parameter gradients of the whole model equal the XLA kernel's (splash also on a 2 x 2 mesh, rows
  split over fsdp and heads over tensor, through shard_map with specs from the logical-axis rules)."""
  logits, grads = _model_logits_and_grads(kernel, mesh)
  ref_logits, ref_grads = _model_logits_and_grads('xla')
  live = np.asarray(_segments() > 0)
  np.testing.assert_allclose(np.asarray(logits)[live], np.asarray(ref_logits)[live], atol=2e-5)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, atol=2e-5, rtol=1e-4)


def test_auto_resolution_table():
  c = lambda **kw: choose_attention('auto', **{'dtype': 'bfloat16', 'packed': True, 'seq_len': 1024, **kw}).kernel
  assert c(platform='gpu', compute_capability='9.0') == 'cudnn'
  assert c(platform='cuda', compute_capability='9.0', packed=False) == 'cudnn'
  assert c(platform='gpu', compute_capability='8.0') == 'cudnn_bias'
  assert c(platform='gpu', compute_capability='8.0', packed=False) == 'cudnn'
  assert c(platform='gpu', compute_capability='9.0', dtype='float32') == 'xla'
  assert c(platform='tpu') == 'splash' and c(platform='tpu', dtype='float32', packed=False) == 'splash'
  assert c(platform='tpu', seq_len=1000) == 'xla'
  assert c(platform='cpu', dtype='float32') == 'blockwise' and c(platform='cpu', seq_len=4096) == 'blockwise'
  assert c(platform='cpu', dtype='float32', seq_len=128) == 'xla'  # one key block: nothing to tile
  assert (
    'bias'
    in choose_attention(
      'auto', platform='gpu', dtype='bfloat16', packed=True, seq_len=1024, compute_capability='8.6'
    ).warning
  )
  # explicit choices that cannot run say which setting to change
  with pytest.raises(ValueError, match='bfloat16'):
    choose_attention('cudnn', platform='gpu', dtype='float32', packed=False, seq_len=1024)
  with pytest.raises(ValueError, match='NVIDIA GPU'):
    choose_attention('cudnn', platform='tpu', dtype='bfloat16', packed=False, seq_len=1024)
  with pytest.raises(ValueError, match='Hopper'):
    choose_attention('cudnn', platform='gpu', dtype='bfloat16', packed=True, seq_len=1024, compute_capability='8.0')
  with pytest.raises(ValueError, match='splash_block_size'):
    choose_attention('splash', platform='tpu', dtype='bfloat16', packed=True, seq_len=640, splash_block=512)
  assert choose_attention('splash', platform='cpu', dtype='float32', packed=True, seq_len=256).warning  # interpret mode


def test_train_step_reports_rows_over_the_document_limit():
  """The step's metric the loop stops on: rows whose documents the static packed layout cannot hold."""
  from neobert_jax.train import mlm
  from tests.support.tiny_train import synthetic_batch, tiny_config

  cfg = tiny_config(vocab_size=64, seq_len=32, batch=2)
  cfg.data.max_documents_per_row = 2
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1}, jax.devices()[:1])
  defs, state = mlm.create_train_state(cfg, mesh)
  train = mlm.jit_mlm_train_step(cfg, mesh, defs)
  batch = synthetic_batch(cfg, mesh, seed=0, as_numpy=True)  # two documents per row: within the limit
  state, metrics = train(state, batch)
  assert int(metrics['rows_over_document_limit']) == 0
  seg = batch['segment_ids'].copy()
  seg[0, 1, 24:] = 3  # a third document in the second row
  state, metrics = train(state, {**batch, 'segment_ids': seg})
  assert int(metrics['rows_over_document_limit']) == 1
