"""What both schemas' optimizer sections share: the range checks (AdamW's betas, eps, weight decay, clipping), the
one way a section's out-of-range value is refused (`section.field=value must be <range>`), and the one warmup
knob (`resolve_warmup`)."""

from __future__ import annotations

import logging
from typing import Iterable

import ml_collections

from neobert_jax.errors import ConfigError

log = logging.getLogger('neobert_jax.config')

Range = tuple[str, bool, str]  # (field, whether its value is in range, the range in words)


def adamw_ranges(o: ml_collections.ConfigDict) -> tuple[Range, ...]:
  """The AdamW fields of an optimizer section (pretraining's and fine-tuning's alike)."""
  return (
    ('b1', 0 <= o.b1 < 1, 'in [0, 1)'),
    ('b2', 0 <= o.b2 < 1, 'in [0, 1)'),
    ('eps', o.eps > 0, '> 0'),
    ('weight_decay', o.weight_decay >= 0, '>= 0'),
    ('clip_norm', o.clip_norm >= 0, '>= 0 (0 disables clipping)'),
  )


def check_ranges(section: str, values: ml_collections.ConfigDict, ranges: Iterable[Range]) -> None:
  """Raises ConfigError naming the first field of `section` whose value is out of its range."""
  for field, ok, needed in ranges:
    if not ok:
      raise ConfigError(f'{section}.{field}={values[field]} must be {needed}')


def resolve_warmup(o: ml_collections.ConfigDict, num_steps: int | None) -> None:
  """The warmup in steps, whichever of the two fields a config or command line set: optimizer.warmup_steps when it
  is > 0 (the explicit count wins over a recipe's warmup_fraction, logged, and the fraction is recorded as 0 so
  config.json says what ran), else warmup_fraction x num_steps, rounded, at least 1 (recorded in warmup_steps;
  a fine-tuning run, whose step count comes from its data, passes None and keeps the share). Idempotent: a config
  this returned resolves to itself."""
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
