"""Test session setup: 8 fake CPU devices so sharded and single-device runs are compared in one process.

The flag must be in the environment before jax initialises its backends, hence at import time here.
"""

import os

os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "gpu: needs a real NVIDIA GPU (run with JAX_PLATFORMS=cuda); skipped on CPU")
