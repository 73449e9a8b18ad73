"""What both schemas' optimizer sections share: the range checks, the warmup knob, and pretraining's choice of
optimizer (AdamW, or Muon on the weight matrices)."""

from __future__ import annotations

import logging

import ml_collections

from neobert_jax.config import Range, check_choices, check_ranges
from neobert_jax.errors import ConfigError

log = logging.getLogger('neobert_jax.config')


def adamw_ranges(o: ml_collections.ConfigDict) -> tuple[Range, ...]:
  """The AdamW fields of an optimizer section (pretraining's and fine-tuning's alike)."""
  return (
    ('b1', 0 <= o.b1 < 1, 'in [0, 1)'),
    ('b2', 0 <= o.b2 < 1, 'in [0, 1)'),
    ('eps', o.eps > 0, '> 0'),
    ('weight_decay', o.weight_decay >= 0, '>= 0'),
    ('clip_norm', o.clip_norm >= 0, '>= 0 (0 disables clipping)'),
  )


def resolve_warmup(o: ml_collections.ConfigDict, num_steps: int | None) -> None:
  """The warmup in steps: warmup_steps when > 0 (it wins over warmup_fraction, logged, and the fraction is
  recorded as 0), else warmup_fraction x num_steps, at least 1. `num_steps` None (fine-tuning) keeps the share.
  Idempotent, so config.json says what ran."""
  if not 0 <= o.warmup_fraction < 1:
    raise ConfigError(f'optimizer.warmup_fraction={o.warmup_fraction} must be in [0, 1) (0: warmup_steps applies)')
  if o.warmup_steps < 0:
    raise ConfigError(f'optimizer.warmup_steps={o.warmup_steps} must be >= 0 (0: warmup_fraction applies)')
  if o.warmup_fraction == 0:
    return
  derived = None if num_steps is None else max(1, round(o.warmup_fraction * num_steps))
  if o.warmup_steps in (0, derived):
    if derived is not None:
      o.warmup_steps = derived
    return
  log.info(
    'optimizer.warmup_steps=%d wins over the warmup_fraction=%g the config sets (recorded as 0)',
    o.warmup_steps,
    o.warmup_fraction,
  )
  o.warmup_fraction = 0.0


# optimizer.name values (engine/optimizer.py builds each), and the weight matrices optimizer.muon_adamw may leave on
# AdamW. Norm scales and biases always take AdamW: Muon orthogonalises matrices.
OPTIMIZERS = ('adamw', 'muon')
MUON_ADAMW_MATRICES = ('embeddings', 'decoder')
MUON_RATE_SCALES = ('rms', 'width')


def optimizer_choice() -> dict[str, object]:
  """Pretraining's optimizer.name and Muon's fields, at their defaults (config/train.py adds them to its section)."""
  return dict(
    # 'adamw': AdamW on every parameter. 'muon': optax.contrib.muon (momentum, then Newton-Schulz orthogonalisation)
    # on the blocks' weight matrices, each layer of the [L, ...] stacks its own matrix; AdamW (the fields above) on
    # norm scales, biases and the matrices named in muon_adamw. Clipping, the schedule and weight decay serve both.
    name='adamw',
    muon_lr=0.0,  # the Muon side's peak rate, on the same schedule as peak_lr; 0 = peak_lr
    muon_momentum=0.95,  # the momentum Muon orthogonalises (Nesterov's unless muon_nesterov=False)
    muon_nesterov=True,
    muon_ns_steps=5,  # Newton-Schulz iterations per update (each costs three matmuls per matrix)
    # How an orthogonalised update is scaled for its shape [fan_in, fan_out]: 'rms' multiplies it by muon_rms x
    # sqrt(max(fan_in, fan_out)) so that its RMS is muon_rms whatever the shape (Moonlight, Liu et al. 2025: about
    # AdamW's, so one rate serves both sides); 'width' by sqrt(max(1, fan_out / fan_in)) (Jordan's Muon, which runs
    # at a rate about ten times AdamW's: set muon_lr)
    muon_rate_scale='rms',
    muon_rms=0.2,
    muon_adamw='embeddings,decoder',  # matrices left on AdamW, comma-separated: embeddings, decoder; '' = none
  )


def muon_adamw(o: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The matrices optimizer.muon_adamw leaves on AdamW, as a tuple of MUON_ADAMW_MATRICES names."""
  return tuple(part.strip() for part in o.muon_adamw.split(',') if part.strip())


def check_optimizer_choice(o: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for an unknown optimizer.name or a Muon field out of its range."""
  check_choices('optimizer', o, (('name', OPTIMIZERS), ('muon_rate_scale', MUON_RATE_SCALES)))
  if unknown := [m for m in muon_adamw(o) if m not in MUON_ADAMW_MATRICES]:
    raise ConfigError(
      f'optimizer.muon_adamw={o.muon_adamw!r} names {", ".join(unknown)}; it lists matrices to leave on AdamW, '
      f'any of {", ".join(MUON_ADAMW_MATRICES)} (norm scales and biases always take AdamW)'
    )
  ranges = (
    ('muon_lr', o.muon_lr >= 0, '>= 0 (0: peak_lr)'),
    ('muon_momentum', 0 <= o.muon_momentum < 1, 'in [0, 1)'),
    ('muon_ns_steps', o.muon_ns_steps >= 1, '>= 1'),
    ('muon_rms', o.muon_rms > 0, '> 0'),
  )
  check_ranges('optimizer', o, ranges)
