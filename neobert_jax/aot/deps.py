"""On-demand install of the heavy compile-only dependencies (libtpu; the jax CUDA plugin and cuDNN).

They are large (libtpu ~0.7 GB, CUDA plugin + cuDNN ~1.6 GB) and useless for training on CPU, so they are
not in requirements.txt. `ensure(kind)` pip-installs them once, with --no-deps, into a cache folder
(NEOBERT_AOT_CACHE, default ~/.cache/neobert_jax/aot/<kind>) and the compile runs in a child interpreter
whose PYTHONPATH points there. Installing into a side folder, not the venv, keeps the venv's jax a pure
CPU install: a CUDA plugin or libtpu found in site-packages would change which backend every test gets.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time

from neobert_jax import commandline

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


def cache_root() -> str:
  return os.environ.get('NEOBERT_AOT_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'neobert_jax', 'aot')


def target_dir(kind: str) -> str:
  return os.path.join(cache_root(), kind)


def _marker(kind: str) -> str:
  return os.path.join(target_dir(kind), '.neobert_complete')


def is_installed(kind: str) -> bool:
  return os.path.exists(_marker(kind))


def ensure(kind: str, *, quiet: bool = False) -> str:
  """Install the packages for `kind` ('tpu' or 'cuda') unless already cached; returns the folder."""
  if kind not in PACKAGES:
    raise ValueError(f'unknown dependency kind {kind!r}; expected one of {sorted(PACKAGES)}')
  final = target_dir(kind)
  if is_installed(kind):
    return final
  os.makedirs(cache_root(), exist_ok=True)
  # A file lock, because several test processes (or users) may ask at once and each download is ~1 GB.
  with open(os.path.join(cache_root(), f'.{kind}.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if is_installed(kind):
      return final
    staging = f'{final}.partial'
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [sys.executable, '-m', 'pip', 'install', '--no-deps', '--disable-pip-version-check', '--target', staging]
    if not quiet:
      print(f'[aot] installing {" ".join(PACKAGES[kind])} into {final} (one time)', file=sys.stderr, flush=True)
    t0 = time.time()
    r = subprocess.run(cmd + PACKAGES[kind], capture_output=True, text=True)
    if r.returncode != 0:
      shutil.rmtree(staging, ignore_errors=True)
      raise DependencyError(f'pip could not install {PACKAGES[kind]}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}')
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    with open(_marker(kind), 'w') as f:
      f.write(' '.join(PACKAGES[kind]) + '\n')
    if not quiet:
      print(f'[aot] installed in {time.time() - t0:.0f}s', file=sys.stderr, flush=True)
  return final


def child_env(kind: str, base: dict | None = None) -> dict:
  """Environment for a child interpreter that compiles for `kind` on this CPU-only machine."""
  env = dict(os.environ if base is None else base)
  paths = [target_dir(kind)]
  if env.get('PYTHONPATH'):
    paths.append(env['PYTHONPATH'])
  env['PYTHONPATH'] = os.pathsep.join(paths)
  # cpu is the only real backend; the plugin (CUDA) or libtpu still registers its compile-only topology.
  # Without JAX_PLATFORMS=cpu the CUDA plugin fails to initialise ("Unable to load CUDA") and is dropped.
  env['JAX_PLATFORMS'] = 'cpu'
  if kind == 'tpu':
    env['TPU_SKIP_MDS_QUERY'] = '1'  # do not ask a GCE metadata server that is not there
    env.setdefault('TPU_ACCELERATOR_TYPE', 'v4-8')  # only silences libtpu's "unknown accelerator" warnings
    env.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  return env


def main(argv=None) -> int:
  """python -m neobert_jax.aot.deps [tpu] [cuda]: pre-install (e.g. in a CI cache step)."""
  p = commandline.Parser('deps', 'neobert_jax.aot.deps', __doc__)
  p.add_argument('kinds', nargs='*', metavar='KIND', help=f'what to install: {", ".join(PACKAGES)} (default: all)')
  a = p.parse_args(argv)
  unknown = sorted(set(a.kinds) - set(PACKAGES))
  if unknown:
    p.error(f'unknown dependency kind {", ".join(unknown)}; expected one of {", ".join(PACKAGES)}')
  for kind in a.kinds or list(PACKAGES):
    print(ensure(kind))
  return 0


if __name__ == '__main__':
  sys.exit(main())
