"""NeoBERT's optimizer: global-norm clipping, then AdamW under a warmup-cosine schedule.

Weight decay follows the paper: every weight matrix decays (the token embedding too unless
`optimizer.decay_embeddings=False`), norm scales and biases never do. The decision is made from the parameter's
path, not its rank, because stacked layers turn the per-layer norm scales [D] into [L, D] matrices.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import ml_collections
import optax


def lr_schedule(opt_cfg: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """Linear 0 -> peak over warmup_steps, cosine to final_lr_fraction*peak at decay_fraction*num_steps, then flat."""
  peak = float(opt_cfg.peak_lr)
  warmup = int(opt_cfg.warmup_steps)
  # optax counts decay_steps from step 0 (warmup included); never let it fall below the warmup or the cosine
  # part would have non-positive length on short runs.
  decay_end = max(int(round(opt_cfg.decay_fraction * num_steps)), warmup + 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=decay_end,
      end_value=peak * float(opt_cfg.final_lr_fraction))


def _path_names(path: tuple[Any, ...]) -> list[str]:
  names = []
  for entry in path:
    for attr in ('key', 'name', 'idx'):
      if hasattr(entry, attr):
        names.append(str(getattr(entry, attr)))
        break
    else:
      names.append(str(entry))
  return names


def decays(names: list[str], decay_embeddings: bool = True) -> bool:
  """Whether the parameter at this path gets weight decay."""
  leaf = names[-1] if names else ''
  if any('norm' in n for n in names) or leaf == 'bias' or leaf == 'scale':
    return False
  if not decay_embeddings and any('embedding' in n for n in names):
    return False
  return True


def weight_decay_mask(decay_embeddings: bool) -> Callable[[Any], Any]:
  """A mask function for optax.adamw: True where a parameter decays, same tree structure as the parameters."""
  def mask(params: Any) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, _: decays(_path_names(path), decay_embeddings), params)
  return mask


def make_optimizer(cfg: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The full transformation (clip -> AdamW) and its schedule, from the `optimizer` and `train` config sections."""
  opt = cfg.optimizer
  schedule = lr_schedule(opt, int(cfg.train.num_steps))
  adamw = optax.adamw(
      learning_rate=schedule, b1=float(opt.b1), b2=float(opt.b2), eps=float(opt.eps),
      weight_decay=float(opt.weight_decay), mask=weight_decay_mask(bool(opt.decay_embeddings)))
  parts = [optax.clip_by_global_norm(float(opt.clip_norm))] if opt.clip_norm > 0 else []
  return optax.chain(*parts, adamw), schedule
