"""One table of accelerator figures: dense bf16 peak (the denominator of every MFU figure), HBM, in-node and
between-node bandwidth, and the *achievable* rates the roofline (aot/roofline.py) divides by.

Peaks and bandwidths are published datasheet figures. Achievable rates: H100 matmul 80.3% (ml-engineering's
mamf-finder table), cuDNN flash attention from FlashAttention-3 (arXiv 2407.08608, Fig. 4 and 6), NCCL from
nccl-tests, HBM streaming 0.9 everywhere; TPU efficiencies have no published per-shape figures and are assumptions,
checked against XLA's TPU cost model (tests/test_aot_roofline.py). `python -m benchmarks.accelerator` measures them."""

from __future__ import annotations

import dataclasses

import numpy as np

# Matmul efficiency against the dense peak as a function of the contraction (inner) length K, for a GEMM with
# enough output tiles to fill the device (tile / wave quantization is applied on top, aot/roofline.py). The top
# row is the measured maximum; the rest follow the pipeline depth (K / 64 main-loop steps per output tile) and are
# an assumption, not a measurement.
_H100_MATMUL = ((64, 0.2), (128, 0.35), (256, 0.52), (512, 0.66), (768, 0.72), (1024, 0.75), (2048, 0.78), (4096, 0.8))
_TPU_MATMUL = ((64, 0.25), (128, 0.45), (256, 0.65), (512, 0.78), (1024, 0.85))  # assumption (see docstring)


@dataclasses.dataclass(frozen=True)
class Accelerator:
  kind: str  # matched against jax's device_kind (case-insensitive substring)
  peak_bf16_flops: float  # dense, per device
  hbm_bytes_per_s: float
  link_bytes_per_s: float | None  # one direction, per device: NVLink inside a node, ICI inside a slice
  dcn_bytes_per_s: float | None  # to another node / slice, per device, one direction
  matmul_efficiency: tuple[tuple[int, float], ...] = _TPU_MATMUL
  # flash attention forward / backward rates (FLOP/s) by key length, head dim 64 (the 250M model's)
  attention_fwd: tuple[tuple[int, float], ...] = ()
  attention_bwd: tuple[tuple[int, float], ...] = ()
  hbm_efficiency: float = 0.9
  link_efficiency: float = 0.8
  tile: tuple[int, int] = (128, 256)  # output tile of a large GEMM kernel (wave quantization)
  cores: int = 1  # tiles in flight at once (SMs; 1 for a TPU's MXUs behind one core)

  def matmul_rate(self, k: int) -> float:
    return self.peak_bf16_flops * _interpolate(self.matmul_efficiency, k)

  def attention_rate(self, seq: int, backward: bool) -> float:
    table = self.attention_bwd if backward else self.attention_fwd
    if not table:  # no published kernel figures: half the matmul rate at this length (assumption)
      return 0.5 * self.matmul_rate(seq)
    return _interpolate(table, seq)


def _interpolate(table: tuple[tuple[int, float], ...], x: float) -> float:
  """Linear in log2(x) between the table's rows, clamped at both ends."""
  return float(np.interp(np.log2(max(x, 1)), np.log2([k for k, _ in table]), [v for _, v in table]))


_H100 = dict(
  peak_bf16_flops=989e12,
  hbm_bytes_per_s=3.35e12,
  link_bytes_per_s=450e9,
  dcn_bytes_per_s=400e9 / 8,
  matmul_efficiency=_H100_MATMUL,
  cores=132,
  attention_fwd=((512, 335e12), (1024, 373e12), (2048, 395e12), (4096, 408e12)),
  attention_bwd=((512, 266e12), (1024, 348e12), (2048, 395e12), (4096, 417e12)),
)

# First match wins, so specific names come first.
ACCELERATORS: tuple[Accelerator, ...] = (
  Accelerator('H200', **{**_H100, 'hbm_bytes_per_s': 4.8e12}),
  Accelerator('H100', **_H100),
  Accelerator('A100', 312e12, 2.04e12, 300e9, None, _H100_MATMUL, cores=108),
  Accelerator('TPU v6 lite', 918e12, 1.64e12, 3584e9 / 8, 100e9 / 8),  # v6e
  Accelerator('TPU v6e', 918e12, 1.64e12, 3584e9 / 8, 100e9 / 8),
  Accelerator('TPU v5 lite', 197e12, 819e9, 1600e9 / 8, 25e9 / 8),  # v5e
  Accelerator('TPU v5e', 197e12, 819e9, 1600e9 / 8, 25e9 / 8),
  Accelerator('TPU v5p', 459e12, 2.765e12, 4800e9 / 8, 50e9 / 8),
  Accelerator('TPU v5', 459e12, 2.765e12, 4800e9 / 8, 50e9 / 8),
  Accelerator('TPU v4', 275e12, 1.228e12, 2400e9 / 8, None),  # v4 publishes no per-chip DCN figure
)


def lookup(device_kind: str) -> Accelerator | None:
  return next((acc for acc in ACCELERATORS if acc.kind.lower() in device_kind.lower()), None)


def peak_flops(device_kind: str) -> float | None:
  """Dense bf16 peak of one device of this kind, or None when it is not in the table."""
  acc = lookup(device_kind)
  return acc.peak_bf16_flops if acc else None
