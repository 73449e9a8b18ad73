"""The range checks both schemas' optimizer sections share (AdamW's betas, eps, weight decay, clipping), and the
one way a section's out-of-range value is refused: `section.field=value must be <range>`."""

from __future__ import annotations

from typing import Iterable

import ml_collections

from neobert_jax.errors import ConfigError

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
