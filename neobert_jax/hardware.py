"""Published figures per accelerator: dense bf16 peak FLOP/s, the denominator of every MFU figure (trainer, AOT,
planner), and the data-centre network bandwidth between slices / nodes (the AOT report's and planner's DCN time).

Owns: those tables and their lookup by jax's device_kind. Imports nothing.
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


# Data-centre network (DCN) bandwidth per device, bytes/s in each direction: what one chip or GPU can send to
# another TPU slice or GPU node. Sources:
#   TPU v5p  Cloud TPU v5p page (cloud.google.com/tpu/docs/v5p): "DCN bandwidth per chip 50 Gbps".
#   TPU v5e  Cloud TPU v6e page (cloud.google.com/tpu/docs/v6e), v5e column: 2 x 100 Gbps NICs per 8-chip host.
#   TPU v6e  the same page: 4 x 200 Gbps NICs per 8-chip host (25.6 Tbps per 256-chip pod) = 100 Gbps per chip.
#   H100 / H200  DGX H100 / H200 (docs.nvidia.com/dgx-basepod, core components): eight single-port 400 Gb/s
#            ConnectX-7 for the compute fabric, one per GPU.
# TPU v4 publishes no per-chip DCN figure, so it has none here (the report then gives bytes without a time).
DCN_BYTES_PER_SECOND: tuple[tuple[str, float], ...] = (
    ('H200', 400e9 / 8),
    ('H100', 400e9 / 8),
    ('TPU v6 lite', 100e9 / 8),
    ('TPU v6e', 100e9 / 8),
    ('TPU v5 lite', 25e9 / 8),
    ('TPU v5e', 25e9 / 8),
    ('TPU v5p', 50e9 / 8),
    ('TPU v5', 50e9 / 8),
)


def _lookup(table: tuple[tuple[str, float], ...], device_kind: str) -> float | None:
  for name, value in table:
    if name.lower() in device_kind.lower():
      return value
  return None


def peak_flops(device_kind: str) -> float | None:
  """Dense bf16 peak of one device of this kind, or None when it is not in the table."""
  return _lookup(PEAK_BF16_FLOPS, device_kind)


def dcn_bandwidth(device_kind: str) -> float | None:
  """DCN bytes/s one device of this kind can send to another slice / node, or None when not in the table."""
  return _lookup(DCN_BYTES_PER_SECOND, device_kind)
