"""NeoBERT's optimizer: global-norm clipping, then AdamW (or Muon) under a warmup then decay schedule. The schedule
is tabulated on the host in float64 and rounded once to float32: the torch scheduler's rate, where on-device float32
would be a few ulps off. Weight decay follows the path, not the rank: stacked layers make norm scales [L, D]."""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from neobert_jax.config.optimizer import muon_adamw
from neobert_jax.config.train import SCHEDULES, decay_window
from neobert_jax.weights.flat import path_names


def floor_step(opt_cfg: ml_collections.ConfigDict, num_steps: int) -> int:
  """The first step at which the rate is the floor for good ('cosine'); 'wsd' and 'linear': decay_window."""
  if opt_cfg.decay_steps > 0:
    return opt_cfg.decay_steps
  # Never below warmup + 1, or the cosine would have no length on short runs.
  return max(round(opt_cfg.decay_fraction * num_steps), opt_cfg.warmup_steps + 1)


# How much of (peak - floor) is left at progress p in [0, 1] of a decay, by optimizer.decay_shape: 1, then 0 at its end.
DECAYS = {
  'linear': lambda p: 1.0 - p,
  'cosine': lambda p: 0.5 * (1.0 + np.cos(math.pi * p)),
  '1-sqrt': lambda p: 1.0 - np.sqrt(p),
}


def lr_values(opt_cfg: ml_collections.ConfigDict, num_steps: int, steps: np.ndarray) -> np.ndarray:
  """The float64 learning rate of the update at each of `steps`; every decay floors at the last update."""
  peak, floor = opt_cfg.peak_lr, opt_cfg.peak_lr * opt_cfg.final_lr_fraction
  warmup, start = opt_cfg.warmup_steps, opt_cfg.warmup_init_fraction
  t = np.asarray(steps, np.float64)
  warm = peak * (start + (1.0 - start) * t / max(warmup, 1))
  kind = opt_cfg.schedule
  if kind == 'constant':
    return np.where(t < warmup, warm, peak)
  if kind in ('wsd', 'linear'):
    first, length = decay_window(opt_cfg, num_steps)
    shape = 'linear' if kind == 'linear' else opt_cfg.decay_shape
    decayed = floor + (peak - floor) * DECAYS[shape](np.clip((t - first + 1) / max(length, 1), 0.0, 1.0))
    return np.where(t < warmup, warm, np.where(t < first, peak, decayed))
  if kind != 'cosine':
    raise ValueError(f'optimizer.schedule={kind!r}; expected one of {SCHEDULES}')
  end = floor_step(opt_cfg, num_steps)
  # The original's cosine has period decay_steps from the end of warmup; ours spans warmup -> floor step exactly.
  period = opt_cfg.decay_steps if opt_cfg.decay_steps > 0 else end - warmup
  cos = floor + (peak - floor) * 0.5 * (1.0 + np.cos(math.pi * (t - warmup) / period))
  return np.where(t < warmup, warm, np.where(t < end, cos, floor))


def lr_schedule(opt_cfg: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """optax schedule: the float32-rounded lr_values, looked up by step (the last entry from `end` on)."""
  if opt_cfg.schedule == 'cosine':  # end: the step from which the rate never changes again
    end = floor_step(opt_cfg, num_steps)
  elif opt_cfg.schedule == 'constant':
    end = opt_cfg.warmup_steps
  else:
    end = max(num_steps - 1, opt_cfg.warmup_steps)
  if opt_cfg.schedule == 'cosine' and opt_cfg.decay_steps > 0 and end <= opt_cfg.warmup_steps:
    raise ValueError(
      f'optimizer.decay_steps={end} is an absolute step and must exceed '
      f'warmup_steps={opt_cfg.warmup_steps} (the original trainer asserts the same)'
    )
  table = lr_values(opt_cfg, num_steps, np.arange(end + 1)).astype(np.float32)
  return lambda count: jnp.asarray(table)[jnp.clip(count, 0, end)]


def decays(names: list[str], decay_embeddings: bool = True) -> bool:
  """Whether the parameter at this path gets weight decay (this project's rule)."""
  leaf = names[-1] if names else ''
  if any('norm' in n for n in names) or leaf == 'bias' or leaf.endswith('_bias') or leaf == 'scale':
    return False
  return decay_embeddings or not any('embedding' in n for n in names)


def weight_decay_mask(decay_embeddings: bool) -> Callable[[Any], Any]:
  """A mask function for optax.adamw: True where a parameter decays, same tree structure as the parameters."""

  def leaf_decays(path: tuple, _) -> bool:
    names = path_names(path)
    # A parameter of an nnx State ends its path with the Variable's `value`: the rule reads the parameter's name.
    return decays(names[:-1] if names[-1:] == ['value'] else names, decay_embeddings)

  return lambda params: jax.tree_util.tree_map_with_path(leaf_decays, params)


def clip_by_global_norm_eps(max_norm: float, eps: float) -> optax.GradientTransformation:
  """torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + eps)); eps=1e-6 there."""

  def clip(updates: Any, params: Any = None) -> Any:
    scale = jnp.minimum(1.0, max_norm / (optax.tree.norm(updates) + eps))
    return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates)

  return optax.stateless(clip)


# Muon's reading of each weight, by the last two names of its path: (input axes, output axes) of the matrix, every
# other axis a batch axis, so each layer of a stacked [L, ...] weight is its own matrix. The optimizer.muon_adamw
# name of the matrices it may leave on AdamW is the third entry.
MUON_AXES: dict[str, tuple[tuple[int, ...], tuple[int, ...], str]] = {
  'layers.qkv': ((1,), (2, 3), ''),  # [L, D, heads, 3 x head_dim]: one [D, 3D] matrix per layer
  'layers.wo': ((1, 2), (3,), ''),  # [L, heads, head_dim, D]: [D, D]
  'layers.w12': ((1,), (2, 3), ''),  # [L, D, 2, F]: the gate and up projections as one [D, 2F]
  'layers.w3': ((1,), (2,), ''),  # [L, F, D]
  'decoder.kernel': ((0,), (1,), 'decoder'),  # [D, vocab]
  'token_embedding.embedding': ((0,), (1,), 'embeddings'),  # [vocab, D]: one-hot rows in, D out
}


def muon_dimensions(on_adamw: tuple[str, ...]) -> Callable[[Any], Any]:
  """optax.contrib.muon's muon_weight_dimension_numbers of the parameters (or a masked tree); None: AdamW's."""

  def one(path: Any, leaf: Any) -> Any:
    names = [n for n in path_names(path) if n != 'value']  # nnx state paths end in the Variable's 'value'
    axes = MUON_AXES.get('.'.join(names[-2:]))
    if axes is None or axes[2] in on_adamw or leaf.ndim <= max(axes[0] + axes[1]):
      return None
    return optax.contrib.MuonDimensionNumbers(axes[0], axes[1])

  return lambda params: jax.tree_util.tree_map_with_path(one, params)


def muon_labels(on_adamw: tuple[str, ...]) -> Callable[[Any], Any]:
  """optax.partition's labels: 'muon' or 'adamw' for each parameter."""
  dims = muon_dimensions(on_adamw)
  is_dims = lambda x: x is None or isinstance(x, optax.contrib.MuonDimensionNumbers)
  return lambda params: jax.tree.map(lambda d: 'adamw' if d is None else 'muon', dims(params), is_leaf=is_dims)


def scale_embedding(tx: optax.GradientTransformation, embedding_lr: float, peak: float) -> optax.GradientTransformation:
  """tx, whose peak rate is `peak`, with the token embedding's update at embedding_lr (0: tx); tx's state is kept."""
  if embedding_lr <= 0:
    return tx

  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    updates, state = tx.update(updates, state, params)
    one = lambda path, u: u * (embedding_lr / peak) if 'token_embedding' in path_names(path) else u
    return jax.tree_util.tree_map_with_path(one, updates), state

  return optax.GradientTransformation(tx.init, update)


def _adamw(opt: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
  adamw = optax.adamw(
    learning_rate=schedule,
    b1=opt.b1,
    b2=opt.b2,
    eps=opt.eps,
    weight_decay=opt.weight_decay,
    mask=None if opt.decay_all_params else weight_decay_mask(opt.decay_embeddings),
  )
  return scale_embedding(adamw, opt.embedding_lr, opt.peak_lr)


def _muon(opt: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
  """optax.contrib.muon on the matrices muon_labels names, AdamW (_adamw) on the rest."""
  peak = opt.muon_lr or opt.peak_lr  # muon_lr 0: the AdamW side's peak
  ratio = peak / opt.peak_lr
  rate = schedule if ratio == 1.0 else (lambda count: schedule(count) * ratio)
  on_adamw = muon_adamw(opt)
  muon = optax.contrib.muon(
    learning_rate=rate,
    ns_steps=opt.muon_ns_steps,
    beta=opt.muon_momentum,
    weight_decay=opt.weight_decay,
    weight_decay_mask=None if opt.decay_all_params else weight_decay_mask(opt.decay_embeddings),
    nesterov=opt.muon_nesterov,
    muon_weight_dimension_numbers=muon_dimensions(on_adamw),
    consistent_rms=opt.muon_rms if opt.muon_rate_scale == 'rms' else None,
  )
  if 'embeddings' not in on_adamw:
    muon = scale_embedding(muon, opt.embedding_lr, peak)
  return optax.partition({'muon': muon, 'adamw': _adamw(opt, schedule)}, muon_labels(on_adamw))


def make_optimizer(
  opt: ml_collections.ConfigDict, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """clip -> AdamW (or Muon and AdamW) and its schedule, from the `optimizer` section and train.num_steps."""
  schedule = lr_schedule(opt, num_steps)
  update = _muon(opt, schedule) if opt.name == 'muon' else _adamw(opt, schedule)
  clip = []
  if opt.clip_norm > 0:
    exact = opt.clip_eps > 0  # torch's rule, eps added to the norm
    clip = [clip_by_global_norm_eps(opt.clip_norm, opt.clip_eps) if exact else optax.clip_by_global_norm(opt.clip_norm)]
  return optax.chain(*clip, update), schedule


def make_finetune_optimizer(
  opt: ml_collections.ConfigDict, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Fine-tuning's clip -> AdamW, warmup then a linear or cosine decay to 0; norm scales and biases never decay."""
  warmup = opt.warmup_steps if opt.get('warmup_steps', 0) > 0 else round(opt.warmup_fraction * num_steps)
  if opt.schedule == 'cosine':
    lr = optax.warmup_cosine_decay_schedule(0.0, opt.lr, warmup, max(num_steps, warmup + 1), 0.0)
  else:
    warm_then_decay = [
      optax.linear_schedule(0.0, opt.lr, max(warmup, 1)),
      optax.linear_schedule(opt.lr, 0.0, max(num_steps - warmup, 1)),
    ]
    lr = optax.join_schedules(warm_then_decay, [max(warmup, 1)])
  tx = optax.adamw(lr, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=weight_decay_mask(True))
  parts = [optax.clip_by_global_norm(opt.clip_norm)] if opt.clip_norm > 0 else []
  return optax.chain(*parts, tx), lr
