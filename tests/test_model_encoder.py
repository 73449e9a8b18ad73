"""The JAX NeoBERT's own invariants: RoPE convention, masking modes, scan/remat equivalence, sharding, heads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from neobert_jax import sharding
from neobert_jax.model import NeoBERTForMLM, default_model_config, train_flops_per_token
from neobert_jax.config.model import validate_model_config
from neobert_jax.model.sizes import ffn_hidden_size
from neobert_jax.model.encoder import rope_angles
from neobert_jax.model.fused import rotate


def small_config(**overrides):
  cfg = default_model_config()
  cfg.update(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=192, vocab_size=128)
  cfg.update(overrides)
  return cfg


def random_ids(batch, length, vocab=128, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, (batch, length)), jnp.int32)


def test_released_config_derives_published_sizes():
  cfg = default_model_config()
  assert ffn_hidden_size(cfg) == 2048
  model = nnx.eval_shape(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param)
  total = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(params))
  # Sum of the published checkpoint's shapes: embedding, 28 blocks (qkv, wo, w12, w3, two norms), norm, decoder.
  block = 2304 * 768 + 768 * 768 + 4096 * 768 + 768 * 2048 + 2 * 768
  assert total == 30522 * 768 + 28 * block + 768 + 30522 * 768 + 30522
  assert model.encoder.layers.qkv.shape == (28, 768, 12, 192)
  assert model.encoder.layers.w12.shape == (28, 768, 2, 2048)
  # 6 x 221.6M matmul params + attention at T=1024: the figure MFU is computed from.
  assert abs(train_flops_per_token(cfg, 1024) / 1.59e9 - 1) < 0.01


def test_rope_rotates_adjacent_pairs_as_complex_numbers():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((1, 5, 2, 8)).astype(np.float32)
  pos = np.array([[0, 1, 2, 7, 100]], np.int32)
  inv = 1.0 / (10000.0 ** (np.arange(0, 8, 2) / 8))
  z = x[..., 0::2] + 1j * x[..., 1::2]
  rotated = z * np.exp(1j * pos[0][None, :, None, None] * inv)
  expected = np.stack([rotated.real, rotated.imag], -1).reshape(x.shape)

  def apply_rope(table_length):
    return np.asarray(rotate(jnp.asarray(x), *rope_angles(jnp.asarray(pos), 8, 10000.0, table_length)))

  np.testing.assert_allclose(apply_rope(128), expected, atol=1e-4)
  # A position past the angle table reads NaN in its own row, never another position's angle.
  past = apply_rope(100)
  np.testing.assert_allclose(past[:, :4], expected[:, :4], atol=1e-4)
  assert np.isnan(past[:, 4]).all()


def test_logits_dot_in_fp32_false_writes_compute_dtype_logits_and_float32_is_untouched():
  ids = random_ids(2, 8)

  def logits(**overrides):
    model = NeoBERTForMLM(small_config(**overrides), rngs=nnx.Rngs(0))
    return np.asarray(model(ids))

  exact, rounded = logits(dtype='bfloat16'), logits(dtype='bfloat16', logits_dot_in_fp32=False)
  assert exact.dtype == rounded.dtype == np.float32
  # The zero-initialised bias adds nothing: every written logit is a bfloat16 value, the float32 ones mostly are not.
  as_bf16 = lambda a: np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(rounded, as_bf16(rounded))
  assert (exact != as_bf16(exact)).mean() > 0.5
  np.testing.assert_allclose(rounded, exact, rtol=1e-2, atol=1e-2)
  # Under float32 compute the setting changes nothing.
  np.testing.assert_array_equal(logits(logits_dot_in_fp32=False), logits())


SPECS = {  # the model's contractions and an operand shape of each
  'btd,dhk->bthk': ((2, 5, 8), (8, 2, 3)),
  'bthk,hkd->btd': ((2, 5, 2, 3), (2, 3, 8)),
  'btd,dgf->btgf': ((2, 5, 8), (8, 2, 6)),
  'btf,fd->btd': ((2, 5, 6), (6, 8)),
  'bpd,dv->bpv': ((2, 4, 8), (8, 11)),
  'bpd,vd->bpv': ((2, 4, 8), (11, 8)),
}


@pytest.mark.parametrize('spec', SPECS)
def test_accumulating_einsum_is_the_einsum_with_its_gradients(spec):
  """fused.einsum_accumulating: in float32 the einsum and its autodiff gradients; in bfloat16 the fp32-accumulated
  product rounded once, and the gradients of the bfloat16 einsum to within bfloat16's rounding."""
  from neobert_jax.model.fused import einsum_accumulating

  keys = jax.random.split(jax.random.key(0), 2)
  a, b = (jax.random.normal(k, shape) for k, shape in zip(keys, SPECS[spec]))
  loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b).astype(jnp.float32)))
  plain = lambda a, b: jnp.einsum(spec, a, b, precision='highest')
  mine = lambda a, b: einsum_accumulating(spec, a, b)
  for got, want in zip(jax.grad(loss(mine), (0, 1))(a, b), jax.grad(loss(plain), (0, 1))(a, b)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  out = einsum_accumulating(spec, a16, b16)
  assert out.dtype == jnp.bfloat16 and einsum_accumulating(spec, a16, b16, jnp.float32).dtype == jnp.float32
  np.testing.assert_array_equal(
    out, jnp.einsum(spec, a16, b16, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
  )
  grads = jax.grad(loss(mine), (0, 1))(a16, b16)
  assert all(g.dtype == jnp.bfloat16 for g in grads)
  for got, want in zip(grads, jax.grad(loss(jax.jit(plain)), (0, 1))(a16, b16)):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-2)


def dot_operand_types(dots: str) -> list[str]:
  """The operand types of every dot in the compiled bfloat16 MLM gradient of small_config on this CPU."""
  import re

  model = NeoBERTForMLM(small_config(dtype='bfloat16', logits_dot_in_fp32=False, dots=dots), rngs=nnx.Rngs(0))
  graph, params = nnx.split(model)
  grad = jax.jit(jax.grad(lambda p, ids: jnp.sum(nnx.merge(graph, p)(ids))))
  text = grad.lower(params, random_ids(2, 8)).compile().as_text()
  types = dict(re.findall(r'(%?[\w.]+) = (\w+)\[', text))
  dots = re.findall(r' dot\((%?[\w.]+), (%?[\w.]+)\)', text)
  return [f'{types.get(a, "?")}x{types.get(b, "?")}' for a, b in dots]


@pytest.mark.skipif(jax.default_backend() != 'cpu', reason="XLA:CPU's dot lowering")
def test_accumulating_dots_stay_bfloat16_on_cpu_where_einsums_are_upcast():
  """Why model.dots exists: XLA:CPU upcasts a bfloat16-out dot and its operands to float32, and keeps bfloat16
  operands when the dot writes float32. If a jax upgrade changes this, 'auto' (config/model.resolve_dots) should
  be measured again."""
  plain, accumulating = dot_operand_types('einsum'), dot_operand_types('accumulating')
  assert len(plain) == len(accumulating), (plain, accumulating)
  # The projections and the decoder, forward and backward (27 dots here, 5 of them the attention's, which keep
  # bfloat16 operands either way): upcast as einsums, bfloat16 as accumulating dots.
  assert plain.count('f32xf32') >= 20 and accumulating.count('f32xf32') <= 2, (plain, accumulating)


@pytest.mark.slow
def test_packed_rows_equal_documents_run_alone():
  cfg = small_config()
  model = nnx.jit(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)))()
  model_call = nnx.jit(lambda m, ids, **kw: m(ids, **kw))
  doc_a, doc_b = random_ids(1, 5, seed=1), random_ids(1, 7, seed=2)
  packed = jnp.concatenate([doc_a, doc_b, jnp.zeros((1, 4), jnp.int32)], axis=1)
  segments = jnp.asarray([[1] * 5 + [2] * 7 + [0] * 4], jnp.int32)
  positions = jnp.asarray([list(range(5)) + list(range(7)) + [0] * 4], jnp.int32)
  out = model_call(model, packed, positions=positions, segment_ids=segments)
  alone_a = model_call(model, doc_a)
  np.testing.assert_allclose(out[:, :5], alone_a, atol=1e-5)
  np.testing.assert_allclose(out[:, 5:12], model_call(model, doc_b), atol=1e-5)
  # Without the segment mask the documents would leak into each other: the check above can fail.
  leaky = model_call(model, packed, positions=positions, lengths=jnp.asarray([12]))
  assert float(jnp.abs(leaky[:, :5] - alone_a).max()) > 1e-3


@pytest.mark.slow
def test_padding_lengths_ignore_padded_keys():
  cfg = small_config()
  model = NeoBERTForMLM(cfg, rngs=nnx.Rngs(0))
  ids = random_ids(2, 10)
  padded = ids.at[1, 6:].set(0)
  out = model(padded, lengths=jnp.asarray([10, 6]))
  np.testing.assert_allclose(out[1, :6], model(ids[1:, :6])[0], atol=1e-5)
  np.testing.assert_allclose(out[0], model(ids[:1])[0], atol=1e-5)


@pytest.mark.slow
def test_scan_unrolled_and_remat_agree_in_value_and_gradient():
  ids = random_ids(2, 12)

  def loss_and_grad(**overrides):
    model = NeoBERTForMLM(small_config(**overrides), rngs=nnx.Rngs(0))
    loss = lambda m: jnp.mean(jax.nn.log_softmax(m(ids))[..., 3])
    return nnx.jit(nnx.value_and_grad(loss))(model)

  base_loss, base_grad = loss_and_grad()
  for overrides in ({'scan_layers': False}, {'remat_policy': 'full'}, {'remat_policy': 'save_dots'}):
    loss, grad = loss_and_grad(**overrides)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(base_grad)):  # other fusions: relative rounding
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_sparse_head_equals_dense_logits_at_the_masked_positions():
  model = NeoBERTForMLM(small_config(), rngs=nnx.Rngs(0))
  ids = random_ids(2, 12)
  where = jnp.asarray([[0, 3, 11], [5, 5, 2]], jnp.int32)
  sparse = model(ids, mlm_positions=where)
  dense = model(ids)
  assert sparse.shape == (2, 3, 128) and sparse.dtype == jnp.float32
  np.testing.assert_allclose(sparse, jnp.take_along_axis(dense, where[:, :, None], axis=1), atol=1e-5)


# One mesh with every axis above 1: the train step's test (tests/test_train_sharding.py) covers data x 8 and fsdp x 8.
@pytest.mark.slow
@pytest.mark.parametrize('mesh_sizes', [{'data': 2, 'fsdp': 2, 'tensor': 2}])
def test_sharded_forward_and_gradient_equal_single_device(mesh_sizes):
  cfg = small_config()
  ids = random_ids(8, 16)
  segments = jnp.asarray(np.repeat([[1] * 9 + [2] * 5 + [0] * 2], 8, 0), jnp.int32)
  loss = lambda m: jnp.mean(m(ids, segment_ids=segments) ** 2)
  ref_loss, ref_grad = nnx.jit(nnx.value_and_grad(loss))(NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)))
  mesh = sharding.make_mesh(mesh_sizes)
  with sharding.activate(mesh):
    model = nnx.jit(lambda: NeoBERTForMLM(cfg, rngs=nnx.Rngs(0)))()
    value, grad = nnx.jit(nnx.value_and_grad(loss))(model)
  expected = jax.sharding.NamedSharding(mesh, sharding.logical_to_spec(('layers', 'embed', None, 'mlp')))
  assert model.encoder.layers.w12[...].sharding.is_equivalent_to(expected, 4)
  np.testing.assert_allclose(value, ref_loss, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_bfloat16_compute_keeps_fp32_params_and_logits():
  model = NeoBERTForMLM(small_config(dtype='bfloat16'), rngs=nnx.Rngs(0))
  logits = model(random_ids(2, 8))
  assert logits.dtype == jnp.float32
  assert model.encoder.layers.qkv[...].dtype == jnp.float32
  assert bool(jnp.isfinite(logits).all())


def test_model_config_errors():
  with pytest.raises(ValueError, match='bfloat16'):
    validate_model_config(small_config(attention_impl='cudnn'))
  with pytest.raises(ValueError, match='num_heads'):
    validate_model_config(small_config(num_heads=5))
  with pytest.raises(ValueError, match='remat_policy'):
    validate_model_config(small_config(remat_policy='sometimes'))
  with pytest.raises(ValueError, match='splash_block_size'):
    validate_model_config(small_config(splash_block_size=100))


def test_mesh_resolution_errors_name_the_fix():
  assert sharding.resolve_layout({'data': -1, 'fsdp': 2, 'tensor': 1}, 8).shape == (4, 2, 1)
  with pytest.raises(ValueError, match='-1'):
    sharding.resolve_layout({'data': 2, 'fsdp': 2, 'tensor': 1}, 8)
  with pytest.raises(ValueError, match='at most one'):
    sharding.resolve_layout({'data': -1, 'fsdp': -1, 'tensor': 1}, 8)
