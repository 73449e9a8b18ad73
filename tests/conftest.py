"""Test session setup: 8 fake CPU devices so sharded and single-device runs are compared in one process.

The flag must be in the environment before jax initialises its backends, hence at import time here.
"""

import os

_DEVICES_FLAG = '--xla_force_host_platform_device_count=8'
# The suite's time is mostly XLA compiling small programs for the CPU, so every test process and every command a
# test starts (they inherit XLA_FLAGS) compiles with less effort: LLVM at -O1 instead of -O2, and XLA's classic
# loop emitters instead of its newer fusion emitters. Measured on a tiny train step: 40% less compile time, steps
# within 15% as fast, the same losses. The flags are part of the compilation cache's key, so a command that a test
# starts with other XLA_FLAGS does not read the test process's programs back. (Flags of the pinned jaxlib.)
COMPILE_FLAGS = '--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false'
for _flag in (_DEVICES_FLAG, *COMPILE_FLAGS.split()):
  if _flag not in os.environ.get('XLA_FLAGS', ''):  # xdist's workers inherit the controller's flags
    os.environ['XLA_FLAGS'] = ' '.join([os.environ.get('XLA_FLAGS', ''), _flag]).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')  # evaluate mteb: MTEB tasks read only the datasets cache

# A persistent compilation cache made fresh for this test run and removed at its end. The tests compile the same
# tiny programs many times, in this process and in the commands they start (which inherit the variables); the
# later compiles read the executable back instead of compiling it again. Every program qualifies (minimum compile
# time 0): the tiny model's compile in well under a second each. Under pytest-xdist (pyproject.toml runs two
# workers) the controller makes the one cache and its workers, which inherit its environment, share it: a
# program one worker compiled is read back by the other. Only the process that made it removes it.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_SHARED_CACHE = 'NEOBERT_TESTS_COMPILE_CACHE'
if os.environ.get('PYTEST_XDIST_WORKER') and os.path.isdir(os.environ.get(_SHARED_CACHE, '')):
  COMPILE_CACHE = os.environ[_SHARED_CACHE]
else:
  COMPILE_CACHE = tempfile.mkdtemp(prefix='neobert-jax-tests-xla-')
  os.environ[_SHARED_CACHE] = COMPILE_CACHE
  atexit.register(shutil.rmtree, COMPILE_CACHE, ignore_errors=True)
os.environ['JAX_COMPILATION_CACHE_DIR'] = COMPILE_CACHE
# Beside it, for the same run's lifetime: the finished runs that several files start from (tests/support/tiny_train.py's
# finished_tiny_run), trained once for both workers.
SHARED_RUNS = os.environ['NEOBERT_TESTS_SHARED_RUNS'] = COMPILE_CACHE + '.runs'
if not os.environ.get('PYTEST_XDIST_WORKER'):
  atexit.register(shutil.rmtree, SHARED_RUNS, ignore_errors=True)
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'

# The marks (slow, multiprocess, server, gpu) are declared in pyproject.toml's [tool.pytest.ini_options].


_HEAVY_MARKS = ('slow', 'multiprocess', 'server')


def pytest_collection_modifyitems(config, items):
  """Files with the most slow, multiprocess or server tests first, the quick files last (a stable sort: each file's
  tests keep their order). xdist hands out whole files in this order (pyproject.toml's --no-loadscope-reorder keeps
  it), so the two workers start on the long files and end on short ones, and neither runs a long file alone while
  the other waits at the end."""
  heavy = {}
  for item in items:
    weight = any(item.get_closest_marker(mark) for mark in _HEAVY_MARKS)
    heavy[item.path] = heavy.get(item.path, 0) + weight
  items.sort(key=lambda item: -heavy[item.path])


def pytest_runtest_logreport(report):
  """With NEOBERT_TEST_TIMES=FILE, every test phase's seconds are appended there as it ends (nodeid, phase,
  seconds): a partial run still tells where the time goes (docs/testing.md, "Running the tests")."""
  out = os.environ.get('NEOBERT_TEST_TIMES')
  if out and not os.environ.get('PYTEST_XDIST_WORKER'):  # xdist hands each report to the controller too: once
    with open(out, 'a') as f:
      f.write(f'{report.nodeid}\t{report.when}\t{report.duration:.2f}\n')


# --- A real GCS server on 127.0.0.1 (gcp-storage-emulator), for the tests of runs and data on a bucket -----------

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

GCS_BUCKET = 'neobert'


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start_gcs_emulator(data_dir=None, bucket=GCS_BUCKET):
  """(process, http url) of a gcp-storage-emulator on a free loopback port, ready to serve; in memory unless
  data_dir is given. Skips (with the reason) where the emulator is not installed."""
  try:
    import gcp_storage_emulator  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    pytest.skip('gcp-storage-emulator is not installed (pip install gcp-storage-emulator)')
  port = _free_port()
  # tests/gcs_emulator.py is the emulator's own command with the x-goog-generation header tensorstore needs.
  cmd = [sys.executable, os.path.join(os.path.dirname(__file__), 'gcs_emulator.py')]
  cmd += [f'--data-dir={data_dir}'] if data_dir else []
  cmd += ['start', '--host=127.0.0.1', f'--port={port}', f'--default-bucket={bucket}']
  cmd += [] if data_dir else ['--in-memory']
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 30
  while time.time() < deadline:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=0.5).close()
      return proc, f'http://127.0.0.1:{port}'
    except OSError:
      time.sleep(0.1)
  proc.kill()
  raise RuntimeError('gcp-storage-emulator did not start in 30 s')


def gcs_env(url):
  """What gcsfs (epath's gs:// backend) and tensorstore (Orbax's) need to talk to the emulator at `url`."""
  return {
    'STORAGE_EMULATOR_HOST': url,
    'TENSORSTORE_GCS_HTTP_URL': url,
    'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'x',
    'GOOGLE_CLOUD_PROJECT': 'test',
  }


@pytest.fixture(scope='session')
def gcs():
  """gs://neobert on an emulator for the whole session (tensorstore reads its endpoint once per process)."""
  proc, url = start_gcs_emulator()
  saved = {k: os.environ.get(k) for k in gcs_env(url)}
  os.environ.update(gcs_env(url))
  yield f'gs://{GCS_BUCKET}'
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v
  proc.terminate()
  proc.wait(timeout=10)
