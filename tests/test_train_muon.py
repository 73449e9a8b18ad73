"""optimizer.name='muon': optax's Muon on the blocks' weight matrices (each layer of a stacked [L, ...] weight its own
matrix), AdamW on the rest; the same numbers on every mesh; with the EMA, gradient accumulation, a batch ramp and a
WSD schedule it trains and resumes bit-identical; a resume that switches optimizer is refused in one line with
nothing touched, a new stage may switch (but not carry the other optimizer's moments over)."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from neobert_jax import errors
from neobert_jax import sharding as shd
from neobert_jax.config import train as schema
from neobert_jax.config.optimizer import muon_adamw
from neobert_jax.engine import optimizer as optimizer_lib
from neobert_jax.engine import state as state_lib
from neobert_jax.train import mlm
from neobert_jax.weights.flat import path_key
from tests.support.tiny_train import (
  assert_resumes_identically,
  files_of,
  synthetic_batch,
  tiny_config,
  train_only,
  run_history,
)

STEPS = 6


def _muon(cfg):
  cfg.optimizer.name = 'muon'
  return cfg


def _labels(cfg):
  """{dotted parameter key: 'muon' or 'adamw'} for cfg's model."""
  params = nnx.state(nnx.eval_shape(mlm.model_factory(cfg)), nnx.Param)
  labels = optimizer_lib.muon_labels(muon_adamw(cfg.optimizer))(params)
  return {path_key(p).removesuffix('.value'): v for p, v in jax.tree_util.tree_flatten_with_path(labels)[0]}


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
  cfg = tiny_config(vocab_size=256, hidden=32, layers=2)
  cfg.model.scan_layers, cfg.model.use_bias = True, True
  labels = _labels(cfg)
  muon = {k for k, v in labels.items() if v == 'muon'}
  assert muon == {f'encoder.layers.{w}' for w in ('qkv', 'wo', 'w12', 'w3')}, labels
  assert labels['decoder.bias'] == labels['encoder.layers.qkv_bias'] == labels['encoder.final_norm'] == 'adamw'
  cfg.optimizer.muon_adamw = ''  # the embedding and the decoder take Muon too
  assert {k for k, v in _labels(cfg).items() if v == 'muon'} == muon | {
    'decoder.kernel',
    'encoder.token_embedding.embedding',
  }
  cfg.model.tie_word_embeddings = True  # the decoder is the embedding: no kernel of its own
  assert 'decoder.kernel' not in _labels(cfg)


def test_each_layer_of_a_stack_is_orthogonalised_as_one_matrix():
  """qkv [L, D, heads, 3 x head_dim]: Muon's update of each layer is a [D, 3D] matrix with singular values near 1
  (Newton-Schulz's ~U(0.5, 1.5)), times the shape scale of muon_rate_scale='width' (sqrt(3D / D))."""
  layers, d, heads = 2, 16, 2
  grads = {'encoder': {'layers': {'qkv': jax.random.normal(jax.random.key(0), (layers, d, heads, 3 * d // heads))}}}
  dims = optimizer_lib.muon_dimensions(())(grads)
  assert dims['encoder']['layers']['qkv'] == optax.contrib.MuonDimensionNumbers((1,), (2, 3))
  tx = optax.contrib.muon(1.0, muon_weight_dimension_numbers=optimizer_lib.muon_dimensions(()), nesterov=False)
  update, _ = tx.update(grads, tx.init(grads), grads)
  for layer in np.asarray(update['encoder']['layers']['qkv']).reshape(layers, d, 3 * d):
    singular = np.linalg.svd(-layer / np.sqrt(3.0), compute_uv=False)
    assert singular.min() > 0.3 and singular.max() < 1.3, singular


@pytest.mark.parametrize('name', ['adamw', 'muon'])
def test_embedding_lr_scales_only_the_embedding_update_and_keeps_the_state(name):
  """optimizer.embedding_lr: the token embedding's update (its weight decay included) is embedding_lr / its side's
  peak of the update without it; every other parameter's is the same, and so is the optimizer state's layout, so a
  run resumes under another embedding rate. On Muon's side (muon_adamw without 'embeddings') the peak is muon_lr."""
  cfg = tiny_config(vocab_size=64, hidden=16, layers=1)
  cfg.optimizer.update(name=name, warmup_steps=0, peak_lr=2e-2, muon_lr=1e-2)
  params = nnx.state(nnx.eval_shape(mlm.model_factory(cfg)), nnx.Param)
  params = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape), params)
  grads = jax.tree.map(lambda p: 0.1 * jnp.cos(p), params)

  def one_update(**fields):
    opt = cfg.optimizer.copy_and_resolve_references()
    opt.update(fields)
    tx = optimizer_lib.make_optimizer(opt, 10)[0]
    state = tx.init(params)
    update, new_state = tx.update(grads, state, params)
    layout = jax.tree.structure(state), jax.tree.structure(new_state)
    return {path_key(p): np.asarray(u) for p, u in jax.tree_util.tree_flatten_with_path(update)[0]}, layout

  for fields, ratio in [({'embedding_lr': 5e-3}, 0.25), ({'embedding_lr': 5e-3, 'muon_adamw': 'decoder'}, 0.5)]:
    if name == 'adamw' and 'muon_adamw' in fields:
      continue
    base, layout = one_update(muon_adamw=fields.get('muon_adamw', cfg.optimizer.muon_adamw))
    scaled, scaled_layout = one_update(**fields)
    assert scaled_layout == layout and scaled.keys() == base.keys()
    for key, u in scaled.items():
      want = base[key] * ratio if 'token_embedding' in key else base[key]
      np.testing.assert_allclose(u, want, rtol=1e-6, err_msg=key)


@pytest.mark.parametrize(
  'field,value,needle',
  [
    ('name', 'lion', "optimizer.name='lion' is unknown; set one of adamw, muon"),
    ('muon_adamw', 'embeddings,norms', 'names norms; it lists matrices to leave on AdamW'),
    ('muon_rate_scale', 'spectral', "optimizer.muon_rate_scale='spectral' is unknown"),
    ('muon_momentum', 1.0, 'optimizer.muon_momentum=1.0 must be in [0, 1)'),
    ('muon_ns_steps', 0, 'optimizer.muon_ns_steps=0 must be >= 1'),
    ('embedding_lr', -1e-3, 'optimizer.embedding_lr=-0.001 must be >= 0'),
  ],
)
def test_muon_fields_are_checked(field, value, needle):
  cfg = tiny_config()
  cfg.optimizer[field] = value
  with pytest.raises(errors.ConfigError) as refused:
    schema.validate_train(cfg)
  assert needle in str(refused.value)


# One sharded mesh: d2f2t2 splits the Muon matrices over fsdp and tensor and the batch over data and fsdp at once,
# the code paths an fsdp8 mesh (also run here before) takes too; one compile fewer.
MESHES = {'one_device': dict(data=1, fsdp=1, tensor=1), 'd2f2t2': dict(data=2, fsdp=2, tensor=2)}


def _sharded_cfg(num_devices=None):
  cfg = _muon(tiny_config(vocab_size=256, hidden=64, layers=2, seq_len=32, batch=16))
  cfg.model.num_heads, cfg.optimizer.warmup_steps = 4, 0  # every step moves the weights
  return schema.validate_train(cfg, num_devices=num_devices)


def _sharded_run(sizes):
  cfg = _sharded_cfg(num_devices=1 if sizes == MESHES['one_device'] else None)
  devices = jax.devices()[:1] if sizes == MESHES['one_device'] else jax.devices()
  mesh = shd.make_mesh(sizes, devices)
  defs, state = mlm.create_train_state(cfg, mesh)
  train = mlm.jit_mlm_train_step(cfg, mesh, defs)
  losses = []
  for _ in range(3):
    state, metrics = train(state, synthetic_batch(cfg, mesh, seed=0))
    losses.append(float(metrics['loss']))
  return losses, jax.device_get(state['params'])


@pytest.mark.slow
def test_a_sharded_muon_run_equals_the_single_device_one():
  ref_losses, ref_params = _sharded_run(MESHES['one_device'])
  assert ref_losses[-1] < ref_losses[0]
  for name in ('d2f2t2',):
    losses, params = _sharded_run(MESHES[name])
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5, err_msg=name)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5, err_msg=name)


def _cfg():
  """Muon with what it must compose with: an EMA, 2 micro-batches, a batch ramp (16 rows, then 32), WSD, and a
  mask rate that falls from 0.2 to 0.1 (data.mask_rate_final)."""
  cfg = _muon(tiny_config(batch=32, steps=STEPS))
  cfg.train.ema_decay, cfg.train.grad_accum_steps = 0.5, 2
  cfg.train.batch_warmup_tokens, cfg.train.batch_warmup_start = 2 * 16 * 128, 16
  cfg.optimizer.schedule, cfg.optimizer.wsd_decay_fraction = 'wsd', 0.5
  cfg.data.mask_rate_final, cfg.checkpoint.async_save = 0.1, False
  return cfg


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('muon')
  assert train_only(_cfg(), workdir).final_step == STEPS
  return workdir


@pytest.mark.slow
def test_muon_trains_with_ema_accumulation_and_a_ramp_and_resumes_bit_identical(finished, tmp_path):
  rows = [json.loads(line) for line in (finished / 'metrics.jsonl').read_text().splitlines()]
  train = [r for r in rows if 'train/loss' in r]
  assert all(np.isfinite([r['train/loss'] for r in train])) and [r['train/batch_size'] for r in train][:3] == [
    16,
    16,
    32,
  ]
  np.testing.assert_allclose([r['train/mask_rate'] for r in train], np.linspace(0.2, 0.1, STEPS))
  assert_resumes_identically(finished, tmp_path / 'run', 3, _cfg())  # as if killed after step 3's checkpoint


@pytest.mark.slow
def test_a_resume_that_switches_optimizer_is_refused_in_one_line(finished, tmp_path, capsys):
  shutil.copytree(finished, tmp_path / 'run')
  before = files_of(tmp_path / 'run')
  cfg = _cfg()
  cfg.optimizer.name = 'adamw'
  with pytest.raises(SystemExit) as stop, errors.reported('train'):
    train_only(cfg, tmp_path / 'run')
  assert stop.value.code == errors.ConfigError.exit_status
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(err) == 1 and "optimizer.name 'muon' -> 'adamw'" in err[0] and 'init.from_checkpoint' in err[0], err
  assert files_of(tmp_path / 'run') == before


@pytest.mark.slow
def test_a_new_stage_may_switch_optimizer_but_not_keep_the_other_one_s_moments(finished, tmp_path):
  cfg = tiny_config(steps=2)
  cfg.init.from_checkpoint, cfg.init.keep_optimizer = str(finished), True
  with pytest.raises(errors.ConfigError) as refused:
    train_only(cfg, tmp_path / 'kept')
  assert "optimizer.name 'muon' -> 'adamw'" in str(refused.value) and 'init.keep_optimizer=False' in str(refused.value)
  assert not (tmp_path / 'kept' / 'checkpoints').exists()
  cfg.init.keep_optimizer = False
  assert train_only(cfg, tmp_path / 'adamw').final_step == 2
  origin = run_history(tmp_path / 'adamw')[0]['origin']
  assert {'field': 'optimizer.name', 'before': 'muon', 'after': 'adamw', 'kind': 'identity'} in origin['changes']


@pytest.mark.slow
def test_a_stage_that_keeps_muon_s_state_restarts_only_the_schedule():
  """init.keep_optimizer under Muon: the schedule's counters restart, the momenta and their counts are kept. The
  one-device config of the sharded test above: its compiled step is read back from the compilation cache."""
  cfg = _sharded_cfg(num_devices=1)
  mesh = shd.make_mesh(MESHES['one_device'], jax.devices()[:1])
  defs, state = mlm.create_train_state(cfg, mesh)
  state, _ = mlm.jit_mlm_train_step(cfg, mesh, defs)(state, synthetic_batch(cfg, mesh, seed=0))
  counts = {
    path_key(p): int(x)
    for p, x in jax.tree_util.tree_flatten_with_path(state_lib.restart_schedule(state['opt']))[0]
    if path_key(p).endswith('count.value') or path_key(p) == 'step.value'
  }
  moments = {k for k in counts if k.endswith('muon.inner_state.0.count.value') or 'adamw.inner_state.0.count' in k}
  assert len(moments) == 2 and all(counts[k] == 1 for k in moments), counts
  assert all(v == 0 for k, v in counts.items() if k not in moments) and len(counts) > len(moments) + 1, counts
