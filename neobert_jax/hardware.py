"""Published dense bf16 peak FLOP/s per accelerator, the denominator of every MFU figure (trainer, AOT, planner).

Owns: that table and its lookup by jax's device_kind. Imports nothing.
"""

from __future__ import annotations

# Matched against jax's device_kind in order (first match wins, so specific names first).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ('H200', 989e12),
    ('H100', 989e12),
    ('A100', 312e12),
    ('TPU v6 lite', 918e12),  # v6e
    ('TPU v6e', 918e12),
    ('TPU v5 lite', 197e12),  # v5e
    ('TPU v5e', 197e12),
    ('TPU v5p', 459e12),
    ('TPU v5', 459e12),
    ('TPU v4', 275e12),
)


def peak_flops(device_kind: str) -> float | None:
  """Dense bf16 peak of one device of this kind, or None when it is not in the table."""
  for name, peak in PEAK_BF16_FLOPS:
    if name.lower() in device_kind.lower():
      return peak
  return None
