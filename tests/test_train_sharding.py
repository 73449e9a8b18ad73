"""The train step gives the same numbers however it is sharded, and however the batch is split into micro-batches."""

import jax
import numpy as np
import pytest

from neobert_jax import sharding as shd
from neobert_jax.engine import step as engine_step
from neobert_jax.train import mlm
from tests.support.tiny_train import synthetic_batch, tiny_config

MESHES = {
  'one_device': dict(data=1, fsdp=1, tensor=1),
  'data8': dict(data=8, fsdp=1, tensor=1),
  'fsdp8': dict(data=1, fsdp=8, tensor=1),
  'd2f2t2': dict(data=2, fsdp=2, tensor=2),
}


def _cfg():
  # vocab, heads and widths divisible by the tensor axis; batch divisible by data x fsdp = 8.
  cfg = tiny_config(vocab_size=256, hidden=64, layers=1, seq_len=32, batch=16)
  cfg.model.num_heads = 4
  return cfg


def _run(cfg, sizes, steps=3):
  devices = jax.devices()[:1] if sizes == MESHES['one_device'] else jax.devices()
  mesh = shd.make_mesh(sizes, devices)
  defs, state = mlm.create_train_state(cfg, mesh)
  # how the freshly created state is laid out (read before training donates its buffers)
  qkv = state['params']['encoder']['layers']['qkv'][...]
  created = {
    'qkv_spec': qkv.sharding.spec,
    'qkv_size': qkv.size,
    'qkv_shard_size': qkv.addressable_shards[0].data.size,
    'opt_specs': [x.sharding.spec for x in jax.tree.leaves(state['opt']) if x.shape == qkv.shape],
  }
  train = mlm.jit_mlm_train_step(cfg, mesh, defs)
  losses = []
  for i in range(steps):
    state, metrics = train(state, synthetic_batch(cfg, mesh, seed=0))  # same batch: the loss must fall
    losses.append(float(metrics['loss']))
  return losses, jax.device_get(state['params']), created


_RUNS = {}


def _cached_run(name):
  """Each mesh is compiled and trained once per session, whichever tests ask for it."""
  if name not in _RUNS:
    _RUNS[name] = _run(_cfg(), MESHES[name])
  return _RUNS[name]


@pytest.fixture(scope='module')
def reference():
  return _cached_run('one_device')


@pytest.mark.slow
@pytest.mark.parametrize('name', ['data8', 'fsdp8', 'd2f2t2'])
def test_same_losses_on_every_mesh(reference, name):
  ref_losses, ref_params, _ = reference
  losses, params, _ = _cached_run(name)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5
    )  # Adam magnifies ulp noise of ~0 grads
  assert ref_losses[-1] < ref_losses[0]  # it actually trains


@pytest.mark.slow
def test_params_and_moments_are_sharded_at_creation():
  created = _cached_run('d2f2t2')[2]  # the state create_train_state made on the 2x2x2 mesh, before any step
  assert created['qkv_spec'] == jax.sharding.PartitionSpec(None, 'fsdp', 'tensor', None)
  # Each device holds a quarter of qkv (fsdp x tensor), never the whole tensor.
  assert created['qkv_shard_size'] == created['qkv_size'] // 4
  assert created['opt_specs'] and all(spec == created['qkv_spec'] for spec in created['opt_specs'])


@pytest.mark.slow
def test_grad_accumulation_matches_one_big_batch():
  """4 micro-batches of 8 rows == one batch of 32, with a different number of masked tokens in each micro-batch."""
  big = _cfg()
  big.train.global_batch_size = 32
  micro = _cfg()
  micro.train.global_batch_size, micro.train.grad_accum_steps = 32, 4
  mesh = shd.make_mesh(MESHES['fsdp8'])
  batch = synthetic_batch(big, mesh, seed=7, as_numpy=True)  # [1, 32, ...]
  results = []
  for cfg, accum in ((big, 1), (micro, 4)):
    defs, state = mlm.create_train_state(cfg, mesh)
    train = mlm.jit_mlm_train_step(cfg, mesh, defs)
    sharding = engine_step.micro_batch_sharding(mesh)
    split = {k: jax.device_put(v.reshape((accum, 32 // accum) + v.shape[2:]), sharding) for k, v in batch.items()}
    counts = batch['mlm_weights'].reshape(accum, -1).sum(-1)
    state, metrics = train(state, split)
    results.append((float(metrics['loss']), float(metrics['grad_norm']), jax.device_get(state['params'])))
  assert len(set(counts.tolist())) > 1  # micro-batches really carry different token counts
  (l1, g1, p1), (l4, g4, p4) = results
  np.testing.assert_allclose(l4, l1, rtol=1e-5)
  np.testing.assert_allclose(g4, g1, rtol=1e-4)
  for a, b in zip(jax.tree.leaves(p4), jax.tree.leaves(p1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
