"""Install the compile-only dependencies ahead of `neobert_jax.compile` (e.g. in a CI cache step): libtpu (~0.7 GB),
the jax CUDA plugin and cuDNN (~1.6 GB).

They are installed once with --no-deps into a cache folder (NEOBERT_AOT_CACHE, default ~/.cache/neobert_jax/aot),
and the compile runs in a child interpreter whose PYTHONPATH points there: a CUDA plugin or libtpu in the venv's
site-packages would change which backend every test gets, so the venv's jax stays a pure CPU install.
"""

import os
import subprocess
import sys
import time

from neobert_jax import commandline
from neobert_jax.data import assets

# Versions that match jax/jaxlib 0.10.2 (jax[tpu]==0.10.2 pins libtpu 0.0.42.*; the CUDA plugin is versioned
# with jax). cuDNN only has to be loadable by the plugin: any 9.x works for a compile-only target.
PACKAGES = {
  'tpu': ['libtpu==0.0.42.*'],
  'cuda': [
    'jax-cuda12-plugin==0.10.2',
    'jax-cuda12-pjrt==0.10.2',
    'nvidia-cudnn-cu12>=9.8,<10',
    'nvidia-cuda-runtime-cu12>=12.1,<13',
  ],
}


class DependencyError(RuntimeError):
  """The optional packages could not be installed (no network, no such wheel, ...)."""


def _root() -> str:
  return os.environ.get('NEOBERT_AOT_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'neobert_jax', 'aot')


def ensure(kind: str) -> str:
  """The folder holding the packages for `kind` ('tpu' or 'cuda'), installed unless already cached."""
  # Locked across processes: several test processes (or users) may ask at once, and each download is ~1 GB.
  return assets.build_once(_root(), kind, lambda _, out: _install(kind, out), marker='.neobert_complete')


def _install(kind: str, out: str) -> None:
  final = os.path.join(_root(), kind)
  print(f'[aot] installing {" ".join(PACKAGES[kind])} into {final} (one time)', file=sys.stderr, flush=True)
  t0 = time.time()
  cmd = [sys.executable, '-m', 'pip', 'install', '--no-deps', '--disable-pip-version-check', '--target', out]
  r = subprocess.run(cmd + PACKAGES[kind], capture_output=True, text=True)
  if r.returncode != 0:
    raise DependencyError(f'pip could not install {PACKAGES[kind]}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}')
  print(f'[aot] installed in {time.time() - t0:.0f}s', file=sys.stderr, flush=True)


def child_env(kind: str) -> dict:
  """Environment for a child interpreter that compiles for `kind` on this CPU-only machine."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (os.path.join(_root(), kind), env.get('PYTHONPATH')) if p)
  # cpu is the only real backend; the plugin (CUDA) or libtpu still registers its compile-only topology.
  # Without JAX_PLATFORMS=cpu the CUDA plugin fails to initialise ("Unable to load CUDA") and is dropped.
  env['JAX_PLATFORMS'] = 'cpu'
  if kind == 'tpu':
    env['TPU_SKIP_MDS_QUERY'] = '1'  # do not ask a GCE metadata server that is not there
    env.setdefault('TPU_ACCELERATOR_TYPE', 'v4-8')  # only silences libtpu's "unknown accelerator" warnings
    env.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  return env


def main(argv=None) -> int:
  """python -m neobert_jax.aot.deps [tpu] [cuda]: pre-install."""
  p = commandline.Parser('deps', 'neobert_jax.aot.deps', __doc__)
  p.add_argument('kinds', nargs='*', metavar='KIND', help=f'what to install: {", ".join(PACKAGES)} (default: all)')
  a = p.parse_args(argv)
  if unknown := sorted(set(a.kinds) - set(PACKAGES)):
    p.error(f'unknown dependency kind {", ".join(unknown)}; expected one of {", ".join(PACKAGES)}')
  for kind in a.kinds or list(PACKAGES):
    print(ensure(kind))
  return 0


if __name__ == '__main__':
  sys.exit(main())
