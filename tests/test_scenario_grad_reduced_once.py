"""With gradient accumulation the gradient crosses the data-parallel replicas, the DCN between slices above all, once
per step (engine/step.py): each replica sums its micro-batches' gradients unreduced, then one reduction follows.

Same numbers as one device on one big batch, on meshes with replicas (data), FSDP and tensor parallelism; and the
compiled step, for fake CPU slices and for two TPU slices (deviceless AOT), sends about one reduction of a device's
gradient shard over the DCN per step, not one per micro-batch.
"""

import json
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

import test_train_sharding as single  # the sharding tests' config; their tolerances
from neobert_jax import config as config_lib
from neobert_jax import sharding as shd
from neobert_jax.aot import collectives
from neobert_jax.engine import step as engine_step
from neobert_jax.train import mlm
from tests.support.tiny_train import REPO_ROOT, synthetic_batch

ROWS, ACCUM = 32, 4
HYBRID = {'data': 1, 'fsdp': 4, 'tensor': 1, 'dcn_data': 2}  # data 2 across "slices" x fsdp 4 inside each
MESHES = {
  'data8': {'data': 8, 'fsdp': 1, 'tensor': 1},  # pure data parallelism: whole gradients, summed once
  'd2f2t2': {'data': 2, 'fsdp': 2, 'tensor': 2},
  'hybrid': HYBRID,
}


def _cfg(accum):
  cfg = single._cfg()
  cfg.train.global_batch_size, cfg.train.grad_accum_steps = ROWS, accum
  return cfg


def _train(sizes, accum, devices, steps=3):
  """Losses and final params of `steps` steps on one fixed batch of ROWS rows, split into `accum` micro-batches."""
  cfg = _cfg(accum)
  mesh = shd.make_mesh(sizes, devices)
  rows = synthetic_batch(_cfg(1), mesh, seed=7, as_numpy=True)  # [1, ROWS, ...]: the same rows for every split
  batch = {
    k: jax.device_put(v.reshape((accum, ROWS // accum) + v.shape[2:]), engine_step.micro_batch_sharding(mesh))
    for k, v in rows.items()
  }
  defs, state = mlm.create_train_state(cfg, mesh)
  train = mlm.jit_mlm_train_step(cfg, mesh, defs)
  losses = []
  for _ in range(steps):
    state, metrics = train(state, batch)
    losses.append(float(metrics['loss']))
  return losses, jax.device_get(state['params']), rows


@pytest.fixture(scope='module')
def one_device_one_batch():
  return _train(single.MESHES['one_device'], 1, jax.devices()[:1])


@pytest.mark.slow
@pytest.mark.parametrize('name', list(MESHES))
def test_accumulating_replicas_match_one_device_on_one_batch(one_device_one_batch, name):
  ref_losses, ref_params, rows = one_device_one_batch
  counts = rows['mlm_weights'].reshape(ACCUM, -1).sum(-1)
  assert len(set(counts.tolist())) > 1  # micro-batches carry different token counts: the sums must be weighted
  losses, params, _ = _train(MESHES[name], ACCUM, jax.devices())
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)
  assert ref_losses[-1] < ref_losses[0]  # it trains (the warmup starts at a learning rate of 0)


def test_replica_axes_are_the_batch_axes_that_do_not_split_the_weights():
  def axes(sizes):
    _, abstract = mlm.abstract_train_state(_cfg(ACCUM), shd.make_mesh(sizes))
    return shd.replica_axes(jax.tree.map(lambda a: a.sharding, abstract['params']))

  assert axes(MESHES['data8']) == ('data',)
  assert axes(MESHES['d2f2t2']) == ('data',)  # fsdp splits the weights: reduce-scattered per micro-batch
  assert axes({'data': 1, 'fsdp': 8, 'tensor': 1}) == ()  # no replicas: the accumulation runs as before


def _one_reduction(cfg, sizes, granules=2):
  """Bytes a device sends over the DCN for one all-reduce of its fp32 gradient shard across `granules` slices
  (aot/collectives.py's hierarchical all-reduce: 2 x shard x (k - 1) / k, the shard itself for 2 slices)."""
  _, abstract = mlm.abstract_train_state(cfg, shd.make_mesh(sizes))
  shard = sum(4 * math.prod(p.sharding.shard_shape(p.shape)) for p in jax.tree.leaves(abstract['params']))
  return 2 * shard * (granules - 1) / granules


def test_compiled_step_reduces_across_slices_once():
  cfg = _cfg(ACCUM)
  mesh = shd.make_mesh(HYBRID)
  defs, abstract = mlm.abstract_train_state(cfg, mesh)
  hlo = mlm.jit_mlm_train_step(cfg, mesh, defs).lower(abstract, mlm.abstract_batch(cfg, mesh)).compile().as_text()
  granules, transfers = collectives.for_mesh(hlo, mesh, shd.resolve_layout(HYBRID, 8))
  assert granules == 2 and transfers
  # Nothing inside the micro-batch loop crosses: every DCN collective runs once per step.
  assert all(t.per_step == 1 for t in transfers), [(t.name, t.per_step) for t in transfers]
  sent, one = sum(t.bytes_per_step for t in transfers), _one_reduction(cfg, HYBRID)
  assert one <= sent <= 1.5 * one, (sent, one)


TPU_CONFIG = """
from neobert_jax.config import train as base
def get_config():
  c = base.get_config()
  c.model.update(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=128, vocab_size=512, max_length=128)
  c.train.global_batch_size, c.train.grad_accum_steps = 32, 4
  return c
"""


@pytest.mark.slow
def test_two_tpu_slices_send_one_gradient_reduction_per_step(tmp_path):
  """The compile report (JSON) of the real step for 2 TPU v5e 2x2 slices, data across them, 4 micro-batches."""
  (tmp_path / 'tiny.py').write_text(TPU_CONFIG)
  out = tmp_path / 'report.json'
  cmd = [sys.executable, '-m', 'neobert_jax.compile', f'--config={tmp_path / "tiny.py"}', '--target=tpu:2xv5e:2x2']
  cmd += ['--config.mesh.fsdp=-1', '--config.mesh.dcn_data=2', f'--json={out}']
  r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
  if r.returncode == 3:
    pytest.skip(f'libtpu could not be installed: {r.stderr[-800:]}')
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  rep = json.loads(out.read_text())
  assert rep['mesh'] == {'data': 2, 'fsdp': 4, 'tensor': 1} and rep['grad_accum'] == 4 and rep['granules'] == 2
  assert list(rep['dcn_collectives']) == ['all-reduce'] and not rep['fsdp_gathers_cross_dcn']
  one = _one_reduction(config_lib.load(tmp_path / 'tiny.py', {'model.dtype': 'float32'}), HYBRID)
  assert one <= rep['dcn_bytes_per_step'] <= 1.5 * one, (rep['dcn_bytes_per_step'], one, rep['dcn_collectives'])
