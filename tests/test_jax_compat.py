"""The private JAX APIs the package still uses (all in neobert_jax/jax_compat.py) are where jax_compat expects them.

A jax upgrade that moves one fails here, loudly, instead of silently changing multi-host start-up or losing cuDNN's
packed attention (which jax_compat imports only when that kernel runs, so this test imports it eagerly).
"""

import logging
import os
from unittest import mock

import jax

from neobert_jax import jax_compat


def test_private_apis_present():
  from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
  from jax._src.clusters import slurm_cluster  # pylint: disable=g-import-not-at-top

  assert callable(hardware_utils.num_available_tpu_chips_and_device_id)
  assert callable(slurm_cluster.SlurmCluster.get_coordinator_address)
  assert isinstance(jax_compat.num_tpu_chips(), int)


def test_private_cudnn_packed_attention_present():
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=g-import-not-at-top

  assert jax_compat.CUDNN_MODULE == cudnn.__name__
  assert callable(cudnn.dot_product_attention) and callable(cudnn.check_compute_capability)
  assert hasattr(cudnn.MaskType, 'PADDING')
  jax_compat.check_cudnn_packed()
  assert jax_compat.cudnn_jax_version_tested(), f'jax {jax.__version__} is outside the tested range'


def test_slurm_coordinator_parses_compressed_node_list():
  env = {'SLURM_JOB_ID': '4242', 'SLURM_STEP_NODELIST': 'gpu[07-09,12],cpu3'}
  with mock.patch.dict(os.environ, env):
    assert jax_compat.slurm_coordinator_address('12345') == 'gpu07:12345'


def test_public_preemption_apis_present():
  # train/pretraining.py decides whether jax's preemption service runs from these two public names.
  assert jax.distributed.is_initialized() is False
  assert isinstance(bool(jax.config.jax_enable_preemption_service), bool)


def test_backend_probe_logger_is_jax_s(caplog):
  jax.devices()  # the probe has run, so the logger exists under this name
  assert jax_compat.BACKEND_PROBE_LOGGER in logging.Logger.manager.loggerDict
  jax_compat.quiet_backend_probe()
  logger = logging.getLogger(jax_compat.BACKEND_PROBE_LOGGER)
  with caplog.at_level(logging.INFO, logger=jax_compat.BACKEND_PROBE_LOGGER):
    logger.info("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
    logger.warning('a real warning')
  assert [r.getMessage() for r in caplog.records] == ['a real warning']
