"""The one place that touches JAX internals; tests/test_jax_compat.py fails loudly when jax moves any of them.

Owns: every use of a private jax module or name, each with the reason no public API serves. Everything else in the
package uses public jax only. Imports jax and nothing from the package. No try/except fallbacks here: a moved
private API must break the test, not silently change behaviour.
"""

from __future__ import annotations

import logging

# Private modules, imported here at load time so that a move fails at once (and in tests/test_jax_compat.py).
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
  """host:port of process 0 in a SLURM step: jax's parser of SLURM's compressed node lists ('node[01-04,07]').

  Private because jax exposes it only through jax.distributed.initialize's own SLURM detection, which also pins
  each process to one GPU (wrong for a process per node); see distributed.py.
  """
  return slurm_cluster.SlurmCluster.get_coordinator_address(timeout_secs=None, override_coordinator_port=port)


def num_tpu_chips() -> int:
  """TPU chips on this machine's PCI bus, found without starting a backend (no public API does that: starting one
  before jax.distributed.initialize would break the multi-host start-up)."""
  try:
    return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
  except OSError:  # an unreadable /sys entry (containers): not a TPU VM. A moved API still raises.
    return 0
