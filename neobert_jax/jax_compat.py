"""The one place that touches JAX internals (SLURM and TPU discovery, the backend-probe log line, cuDNN's packed
attention layout), each with the reason no public API serves; tests/test_jax_compat.py fails loudly when jax moves
one. No try/except fallbacks: a moved private API must break the test, not silently change behaviour."""

from __future__ import annotations

import functools
import importlib
import logging

import jax

# Private modules every start-up needs, imported at load time so that a move fails at once (and in the test).
from jax._src import hardware_utils
from jax._src.clusters import slurm_cluster

# jax logs the quiet failure of each optional backend probe (libtpu, CUDA plugin) at INFO under this logger, e.g.
# "Unable to initialize backend 'tpu': ... libtpu.so: cannot open shared object file", on every start of every
# CPU or GPU machine. A backend the user asked for (JAX_PLATFORMS) fails loudly with an exception, not this log.
BACKEND_PROBE_LOGGER = 'jax._src.xla_bridge'
BACKEND_PROBE_PREFIX = 'Unable to initialize backend'


class _DropBackendProbe(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno <= logging.INFO and str(record.msg).startswith(BACKEND_PROBE_PREFIX))


def quiet_backend_probe() -> None:
  """Drops jax's INFO lines about optional backends that are not installed; warnings and errors still show."""
  logger = logging.getLogger(BACKEND_PROBE_LOGGER)
  if not any(isinstance(f, _DropBackendProbe) for f in logger.filters):
    logger.addFilter(_DropBackendProbe())


def slurm_coordinator_address(port: str | None) -> str:
  """host:port of SLURM process 0 by jax's private parser (its public detection pins one GPU per process)."""
  return slurm_cluster.SlurmCluster.get_coordinator_address(timeout_secs=None, override_coordinator_port=port)


def num_tpu_chips() -> int:
  """TPU chips on the PCI bus, without starting a backend (that would break jax.distributed.initialize)."""
  try:
    return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
  except OSError:  # an unreadable /sys entry (containers): not a TPU VM. A moved API still raises.
    return 0


# cuDNN packed attention. jax.nn.dot_product_attention has no segment-id or offset argument, so packed rows reach
# cuDNN's plain flash kernel only through this private module's dot_product_attention(q_seqlen, kv_seqlen,
# q_offsets, kv_offsets, mask_type=PADDING) (present since jax 0.6; needs Hopper and cuDNN >= 9.6). Unlike the
# modules above it is imported on first use, inside the functions below: a jax that moved it still trains with
# every other kernel, and a run that picks 'cudnn' gets one clear error at trace time. The test imports it
# eagerly, so a jax upgrade that moves it fails there.
CUDNN_MODULE = 'jax._src.cudnn.fused_attention_stablehlo'
_CUDNN_NEEDED = ('dot_product_attention', 'MaskType', 'check_compute_capability')
# Releases whose private signature the packed-layout call was written and compile-tested against.
CUDNN_TESTED_JAX = ((0, 6), (0, 12))


class CudnnPackedUnavailable(RuntimeError):
  """The installed jax no longer exposes the packed-layout entry point this module relies on."""


def check_cudnn_packed():
  """The private cuDNN module; CudnnPackedUnavailable if the entry point moved (the tests call it)."""
  try:
    mod = importlib.import_module(CUDNN_MODULE)
  except ImportError as e:
    mod, problem = None, f'cannot be imported ({e})'
  else:
    missing = [name for name in _CUDNN_NEEDED if not hasattr(mod, name)]
    problem = f'lacks {missing}' if missing else ''
  if problem:
    raise CudnnPackedUnavailable(
      f'jax {jax.__version__}: {CUDNN_MODULE} {problem}; cuDNN packed attention is unavailable. Use '
      '--config.model.attention_impl=cudnn_bias (segment mask as a bias) or --config.data.packing=none.'
    )
  return mod


def cudnn_jax_version_tested() -> bool:
  major_minor = tuple(int(p) for p in jax.__version__.split('.')[:2])
  return CUDNN_TESTED_JAX[0] <= major_minor <= CUDNN_TESTED_JAX[1]


@functools.cache
def _warn_if_cudnn_untested() -> None:
  if not cudnn_jax_version_tested():
    logging.getLogger(__name__).warning(
      'jax %s is outside the releases the cuDNN packed-layout call was tested with (%s - %s); the private '
      'signature may have changed: run tests/test_model_attention_gpu.py on a GPU before training.',
      jax.__version__,
      '.'.join(map(str, CUDNN_TESTED_JAX[0])),
      '.'.join(map(str, CUDNN_TESTED_JAX[1])),
    )


def cudnn_packed_flash_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, seqlens: jax.Array, offsets: jax.Array
) -> jax.Array:
  """q, k, v [B, T, H, Dh] (bf16/fp16) with packed_layout()'s seqlens [B, M] / offsets [B, M + 1] -> [B, T, H, Dh]."""
  mod = check_cudnn_packed()
  _warn_if_cudnn_untested()
  layout = dict(scale=q.shape[-1] ** -0.5, mask_type=mod.MaskType.PADDING, qkv_layout='BTNH')
  return mod.dot_product_attention(q, k, v, None, None, seqlens, seqlens, offsets, offsets, **layout)


def cudnn_assume_compute_capability(major_minor: str) -> None:
  """Deviceless AOT only: answer cuDNN's Hopper check for the compile target, not the default (CPU) backend."""
  mod = check_cudnn_packed()
  target = tuple(int(x) for x in major_minor.split('.'))
  mod.check_compute_capability = lambda capability: target >= tuple(int(x) for x in capability.split('.'))
