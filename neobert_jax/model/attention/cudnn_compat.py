"""The one place that touches jax's private cuDNN attention module (packed / ragged layout).

jax.nn.dot_product_attention has no segment-id or offset argument, so packed rows reach cuDNN's plain flash kernel
only through `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(q_seqlen, kv_seqlen, q_offsets,
kv_offsets, mask_type=PADDING)` (present since jax 0.6; needs Hopper and cuDNN >= 9.6). Everything private is
looked up here, checked by `check()` (a test calls it, so a jax upgrade that moves it fails loudly) and raised as
one clear error at trace time, never replaced by a silent fallback.

Owns: the private API surface. Imports nothing from the rest of the package.
"""

from __future__ import annotations

import functools
import importlib
import logging

import jax

_MODULE = "jax._src.cudnn.fused_attention_stablehlo"
_NEEDED = ("dot_product_attention", "MaskType", "check_compute_capability")
# Releases whose private signature this module was written and compile-tested against.
TESTED_JAX = ((0, 6), (0, 12))


class CudnnPackedUnavailable(RuntimeError):
  """The installed jax no longer exposes the packed-layout entry point this module relies on."""


def _module():
  try:
    mod = importlib.import_module(_MODULE)
  except ImportError as e:
    raise CudnnPackedUnavailable(
        f"jax {jax.__version__} has no {_MODULE} ({e}); cuDNN packed attention is unavailable. Use "
        "--config.model.attention_impl=cudnn_bias (segment mask as a bias) or --config.data.packing=none.") from e
  missing = [name for name in _NEEDED if not hasattr(mod, name)]
  if missing:
    raise CudnnPackedUnavailable(
        f"jax {jax.__version__}: {_MODULE} lacks {missing}; cuDNN packed attention is unavailable. Use "
        "--config.model.attention_impl=cudnn_bias or --config.data.packing=none.")
  return mod


def jax_version_tested() -> bool:
  major_minor = tuple(int(p) for p in jax.__version__.split(".")[:2])
  return TESTED_JAX[0] <= major_minor <= TESTED_JAX[1]


@functools.cache
def _warn_if_untested() -> None:
  if not jax_version_tested():
    logging.getLogger(__name__).warning(
        'jax %s is outside the releases the cuDNN packed-layout call was tested with (%s - %s); the private '
        'signature may have changed: run tests/test_attention_gpu.py on a GPU before training.', jax.__version__,
        '.'.join(map(str, TESTED_JAX[0])), '.'.join(map(str, TESTED_JAX[1])))


def check() -> None:
  """Raises CudnnPackedUnavailable if the private entry point moved (called by the tests and at trace time)."""
  _module()


def packed_flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, seqlens: jax.Array,
                           offsets: jax.Array) -> jax.Array:
  """q, k, v [B, T, H, Dh] (bf16/fp16) with packed_layout()'s seqlens [B, M] / offsets [B, M + 1] -> [B, T, H, Dh]."""
  mod = _module()
  _warn_if_untested()
  return mod.dot_product_attention(
      q, k, v, None, None, seqlens, seqlens, offsets, offsets, scale=q.shape[-1] ** -0.5,
      mask_type=mod.MaskType.PADDING, qkv_layout="BTNH")


def assume_compute_capability(major_minor: str) -> None:
  """For deviceless AOT only: the cuDNN checks ask the *default* backend (the CPU there) whether the GPU is
  Hopper; answer for the compile target instead. Never called in a process that trains."""
  mod = _module()
  target = tuple(int(x) for x in major_minor.split("."))
  mod.check_compute_capability = lambda capability: target >= tuple(int(x) for x in capability.split("."))
