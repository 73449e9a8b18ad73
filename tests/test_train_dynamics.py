"""The original NeoBERT trainer's dynamics, step for step: our PyTorch NeoBERT under torch.optim.AdamW, the original
SequentialLR schedule (LinearLR from 1e-4 x peak, CosineAnnealingLR cut at an absolute step, then the floor) and
torch's clip_grad_norm_, against the JAX train step with configs/neobert_250m.py:original's optimizer choices.

Same initial weights, same batches, fp32, 24 steps crossing warmup, cosine, the cut and the floor, with clipping
active on some steps and not others. Every step: the learning rate is exactly equal (torch's float64 value rounded
to float32, what the JAX step applies), the loss agrees to LOSS_RTOL, every parameter to PARAM_ATOL.
"""

import importlib.util
import warnings

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR

from neobert_jax import sharding as shd
from neobert_jax.convert import torch_ref
from tests.support import torch_reference
from tests.support.tiny_train import REPO_ROOT
from neobert_jax.engine import step as engine_step
from neobert_jax.train import mlm
from tests.support.tiny_train import synthetic_batch, tiny_config
from neobert_jax.weights.flat import to_flat

STEPS, WARMUP, DECAY_STEPS = 24, 5, 18  # the cosine is cut at step 18, then the floor for 6 steps
PEAK, CLIP = 3e-3, 1.8  # gradient norms here run 1.5-2.1: clipping acts on some steps, not others
LOSS_RTOL = 1e-5  # measured: 2.4e-7 worst relative loss difference over the 24 steps
PARAM_ATOL = 1e-5  # measured: 9.5e-7 worst, growing ~4e-8 a step; the parameters move by ~3e-2 in the run


def _original_config():
  path = REPO_ROOT / 'configs' / 'neobert_250m.py'
  spec = importlib.util.spec_from_file_location('_neobert_250m', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  original = module.get_config('original').optimizer
  cfg = tiny_config(vocab_size=512, hidden=64, layers=2, seq_len=32, batch=8, steps=STEPS)
  cfg.model.num_heads = 4
  cfg.model.dtype = 'float32'
  o = cfg.optimizer
  for k in (
    'b1',
    'b2',
    'eps',
    'weight_decay',
    'final_lr_fraction',
    'warmup_init_fraction',
    'decay_all_params',
    'clip_eps',
  ):
    o[k] = original[k]
  o.peak_lr, o.clip_norm, o.warmup_steps, o.decay_steps = PEAK, CLIP, WARMUP, DECAY_STEPS  # scaled down
  return cfg, original


def _torch_loss(model, b):
  logits = model(
    input_ids=torch.from_numpy(b['input_ids'].astype(np.int64)),
    position_ids=torch.from_numpy(b['positions'].astype(np.int64)),
    segment_ids=torch.from_numpy(b['segment_ids'].astype(np.int64)),
  ).logits
  picked = torch.gather(
    logits, 1, torch.from_numpy(b['mlm_positions'].astype(np.int64))[..., None].expand(-1, -1, logits.shape[-1])
  )
  ce = torch.nn.functional.cross_entropy(
    picked.flatten(0, 1), torch.from_numpy(b['mlm_labels'].astype(np.int64)).flatten(), reduction='none'
  )
  w = torch.from_numpy(b['mlm_weights']).flatten()
  return (ce * w).sum() / w.sum()  # the original's mean over the masked tokens


@pytest.fixture(scope='module')
def runs():
  cfg, original = _original_config()
  mesh = shd.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  defs, state = mlm.create_train_state(cfg, mesh)
  flat0 = to_flat(nnx.merge(defs.model_def, state['params']))
  train = mlm.jit_mlm_train_step(cfg, mesh, defs)

  model = torch_ref.torch_model_from_flat(flat0, cfg.model).train()
  o = cfg.optimizer
  opt = torch.optim.AdamW(model.parameters(), lr=o.peak_lr, betas=(o.b1, o.b2), eps=o.eps, weight_decay=o.weight_decay)
  with warnings.catch_warnings():  # SequentialLR's own deprecation chatter
    warnings.simplefilter('ignore')
    sched = SequentialLR(
      opt,
      [
        LinearLR(opt, start_factor=o.warmup_init_fraction, end_factor=1.0, total_iters=o.warmup_steps),
        CosineAnnealingLR(opt, T_max=o.decay_steps, eta_min=o.peak_lr * o.final_lr_fraction),
        LambdaLR(opt, lambda _: o.final_lr_fraction),
      ],
      milestones=[o.warmup_steps, o.decay_steps],
    )
  rows = []
  for i in range(STEPS):
    batch = synthetic_batch(cfg, mesh, seed=100 + i, as_numpy=True)
    state, m = train(state, {k: jax.device_put(v, engine_step.micro_batch_sharding(mesh)) for k, v in batch.items()})
    opt.zero_grad()
    loss = _torch_loss(model, {k: v[0] for k, v in batch.items()})
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm)
    lr = opt.param_groups[0]['lr']
    opt.step()
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      sched.step()
    jflat = to_flat(nnx.merge(defs.model_def, state['params']))
    tflat = torch_reference.flat_from_torch_model(model, cfg.model)
    rows.append(
      dict(
        jax_loss=float(m['loss']),
        torch_loss=float(loss.detach()),
        jax_lr=np.asarray(m['learning_rate']),
        torch_lr=lr,
        clipped=float(norm) > o.clip_norm,
        jax_norm=float(m['grad_norm']),
        torch_norm=float(norm),
        param_diff=max(float(np.abs(jflat[k] - tflat[k]).max()) for k in jflat),
        moved=max(float(np.abs(jflat[k] - flat0[k]).max()) for k in jflat),
      )
    )
  return cfg, original, rows


def test_original_switch_holds_the_original_trainers_choices():
  _, original = _original_config()
  assert (original.warmup_init_fraction, original.decay_steps, original.decay_all_params, original.clip_eps) == (
    1e-4,
    900_000,
    True,
    1e-6,
  )
  assert (original.peak_lr, original.warmup_steps, original.final_lr_fraction) == (6e-4, 2000, 0.1)


@pytest.mark.slow
def test_learning_rate_is_exactly_the_original_schedule(runs):
  _, _, rows = runs
  for i, r in enumerate(rows):
    assert r['jax_lr'].dtype == np.float32 and r['jax_lr'] == np.float32(r['torch_lr']), (i, r)
  lrs = [r['torch_lr'] for r in rows]
  assert lrs[0] == pytest.approx(PEAK * 1e-4) and lrs[WARMUP] == pytest.approx(PEAK)
  assert lrs[DECAY_STEPS - 1] > PEAK * 0.1 * 1.001 and lrs[DECAY_STEPS:] == [pytest.approx(PEAK * 0.1)] * (
    STEPS - DECAY_STEPS
  )


@pytest.mark.slow
def test_loss_and_parameters_agree_at_every_step(runs):
  _, _, rows = runs
  assert any(r['clipped'] for r in rows) and not all(r['clipped'] for r in rows)
  for i, r in enumerate(rows):
    assert r['jax_loss'] == pytest.approx(r['torch_loss'], rel=LOSS_RTOL), (i, r)
    assert r['jax_norm'] == pytest.approx(r['torch_norm'], rel=LOSS_RTOL), (i, r)
    assert r['param_diff'] < PARAM_ATOL, (i, r)
  assert rows[-1]['moved'] > 1000 * PARAM_ATOL  # the agreement is not that of parameters standing still


def test_our_schedule_differs_where_documented():
  from neobert_jax.engine import optimizer

  cfg, _ = _original_config()
  ours = tiny_config(steps=100).optimizer
  ours.peak_lr, ours.warmup_steps = PEAK, WARMUP
  lr = optimizer.lr_values(ours, 100, np.arange(101))
  assert lr[0] == 0 and lr[WARMUP] == PEAK and lr[90] == pytest.approx(PEAK * 0.1) and lr[89] > lr[90]
  orig = optimizer.lr_values(cfg.optimizer, 100, np.arange(101))
  assert orig[DECAY_STEPS - 1] - PEAK * 0.1 > 1e-5  # cut before reaching the floor, then the floor
