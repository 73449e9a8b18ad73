"""Hybrid meshes: data / fsdp / tensor inside a slice or node, dcn_data / dcn_fsdp across them.

8 fake CPU devices stand in for 2 "slices" x 4 (one process: devices 0-3 are slice 0, 4-7 slice 1).
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import test_train_sharding as single  # the sharding tests' config, run helper and cached one-device reference
from neobert_jax import sharding as shd
from neobert_jax.aot import collectives, targets
from neobert_jax.errors import ConfigError
from neobert_jax.config import train as train_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HYBRID = {'data': 1, 'fsdp': 4, 'tensor': 1, 'dcn_data': 2}  # data 2 across slices x fsdp 4 inside each


def test_layout_keeps_fsdp_inside_a_slice():
  mesh = shd.make_mesh(HYBRID)
  assert dict(mesh.shape) == {'data': 2, 'fsdp': 4, 'tensor': 1}
  # data index = slice: each slice's four devices make up one FSDP group
  assert [[d.id for d in row] for row in mesh.devices[:, :, 0]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  fsdp_across = shd.make_mesh({'data': 2, 'fsdp': -1, 'tensor': 1, 'dcn_fsdp': 2})
  assert [[d.id for d in row] for row in fsdp_across.devices[:, :, 0]] == [[0, 1, 4, 5], [2, 3, 6, 7]]
  assert shd.granule_ids(fsdp_across, shd.resolve_layout({'data': 2, 'fsdp': -1, 'tensor': 1, 'dcn_fsdp': 2}, 8)) == [
    0,
    0,
    1,
    1,
    0,
    0,
    1,
    1,
  ]


def test_config_sizes_are_per_slice_and_refused_when_they_cannot_be():
  cfg = single._cfg()
  cfg.mesh.update(HYBRID, fsdp=-1)
  assert train_config.mesh_shape(cfg, 8) == {'data': 1, 'fsdp': 4, 'tensor': 1, 'dcn_data': 2, 'dcn_fsdp': 1}
  train_config.validate_train(cfg, num_devices=8, process_count=2)
  for change, words in (
    ({'dcn_data': 3}, 'do not split into'),
    ({'dcn_fsdp': 0}, '>= 1'),
    ({'fsdp': 8}, 'per slice / node'),
  ):
    bad = single._cfg()
    bad.mesh.update(HYBRID, **change)
    with pytest.raises(ConfigError, match=words):
      train_config.validate_train(bad, num_devices=8, process_count=1)
  with pytest.raises(ConfigError, match='processes do not split'):
    train_config.validate_train(cfg, num_devices=8, process_count=3)
  with pytest.raises(ValueError, match='tensor parallelism stays inside'):
    shd.resolve_layout({**HYBRID, 'dcn_tensor': 2}, 8)


@pytest.mark.slow
@pytest.mark.parametrize(
  'sizes', [HYBRID, {'data': 2, 'fsdp': 2, 'tensor': 1, 'dcn_fsdp': 2}], ids=['data_across', 'fsdp_across']
)
def test_two_slices_of_four_train_like_one_device(sizes):
  ref_losses, ref_params, _ = single._cached_run('one_device')
  losses, params, created = single._run(single._cfg(), sizes)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)
  # parameters are split over the fsdp axis (4 devices: inside a slice, or 2 per slice x 2 slices)
  assert created['qkv_shard_size'] == created['qkv_size'] // 4


def test_dcn_classifier_on_a_compiled_program():
  mesh = shd.make_mesh(HYBRID)

  def step(x):  # x: this device's [1, 64] row
    def body(c, _):
      return jax.lax.psum(c * x + 1.0, 'data'), None  # across slices, 3 times (a loop)

    c, _ = jax.lax.scan(body, x, None, length=3)
    inside = jax.lax.psum(c, 'fsdp') + jax.lax.all_gather(x, 'fsdp', tiled=True).sum(0, keepdims=True)
    return inside + jax.lax.all_gather(x, 'data', tiled=True).sum(0, keepdims=True)  # across, once

  f = jax.jit(
    jax.shard_map(step, mesh=mesh, in_specs=P(('data', 'fsdp')), out_specs=P(('data', 'fsdp')), check_vma=False)
  )
  hlo = f.lower(jax.ShapeDtypeStruct((8, 64), jnp.float32)).compile().as_text()
  granules, transfers = collectives.for_mesh(hlo, mesh, shd.resolve_layout(HYBRID, 8))
  assert granules == 2
  # only the two collectives over 'data' cross; each device sends its 256-byte row to the other slice
  assert sorted((t.kind, t.per_step, t.granules, t.dcn_bytes) for t in transfers) == [
    ('all-gather', 1, 2, 256),
    ('all-reduce', 3, 2, 256),
  ]
  assert collectives.by_kind(transfers)['all-reduce'] == {'ops': 1, 'per_step': 3, 'bytes': 768}


def test_replica_group_spellings():
  # XLA's mesh form: positions (a0, a1) hold device ids iota([2,4]).T; groups run along axis_1
  assert collectives.replica_groups(
    "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, dimensions={0}", 8
  ) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert collectives.replica_groups("replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}", 8) == [list(range(8))]
  assert collectives.replica_groups('replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}', 8) == [
    [0, 4],
    [1, 5],
    [2, 6],
    [3, 7],
  ]
  assert collectives.replica_groups('replica_groups={}, to_apply=%add', 4) == [[0, 1, 2, 3]]


def test_targets_count_their_slices_and_hosts():
  t = targets.parse_target('tpu:2xv5p-128')  # two v5p-128 slices (64 chips each)
  assert (t.num_devices, t.num_slices, t.num_granules, t.tpu_topology) == (128, 2, 2, 'v5p:4x4x4')
  assert targets.parse_target('tpu:v5e-4').num_granules == 1
  assert targets.parse_target('cuda:h100x16').num_granules == 2  # 2 hosts x 8, one process each
  assert t.dcn_bandwidth == 50e9 / 8  # 50 Gbps per v5p chip


@pytest.mark.slow
def test_two_slice_tpu_compile_reports_what_crosses_the_dcn(tmp_path):
  """The real train step for 2 TPU v5e 2x2 slices with FSDP over both: its gathers cross, and are flagged."""
  cfg = tmp_path / 'tiny.py'
  cfg.write_text(
    'from configs import base\n'
    'def get_config():\n'
    '  c = base.get_config()\n'
    '  c.model.update(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=128, vocab_size=512,'
    ' max_length=128)\n'
    '  c.train.global_batch_size = 16\n'
    '  return c\n'
  )
  out = tmp_path / 'report.json'
  r = subprocess.run(
    [
      sys.executable,
      '-m',
      'neobert_jax.compile',
      f'--config={cfg}',
      '--target=tpu:2xv5e:2x2',
      '--config.mesh.dcn_fsdp=2',
      f'--json={out}',
    ],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=600,
  )
  if r.returncode == 3:
    pytest.skip(f'libtpu could not be installed: {r.stderr[-800:]}')
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  rep = json.loads(out.read_text())
  assert rep['num_devices'] == 8 and rep['mesh'] == {'data': 1, 'fsdp': 8, 'tensor': 1}
  assert rep['granules'] == 2 and rep['dcn'] == {'dcn_data': 1, 'dcn_fsdp': 2}
  kinds = rep['dcn_collectives']
  # per-layer parameter gathers (inside the layer scan: more runs than instructions) and the gradient reduction
  assert kinds['all-gather']['per_step'] > kinds['all-gather']['ops'] and kinds['all-reduce']['bytes'] > 0
  assert rep['fsdp_gathers_cross_dcn'] and rep['dcn_seconds'] > 0
  assert "warning       FSDP's parameter all-gathers cross the DCN" in r.stdout
