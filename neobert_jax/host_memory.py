"""Host memory: glibc's malloc on transparent huge pages for the training commands, by re-executing once with
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (read at process start; why and what it saves: docs/performance.md, "Huge
pages"). Skipped off glibc 2.35+, when THP is not `madvise`, when the tunable is set, or with
NEOBERT_JAX_HUGE_PAGES=0."""

from __future__ import annotations

import os
import platform
import sys

ENV_SWITCH = 'NEOBERT_JAX_HUGE_PAGES'  # '0' keeps the process as started
TUNABLE = 'glibc.malloc.hugetlb'
_THP_MODE = '/sys/kernel/mm/transparent_hugepage/enabled'


def _thp_mode() -> str:
  """The kernel's THP mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled, '' if unreadable."""
  try:
    with open(_THP_MODE, encoding='ascii') as f:
      text = f.read()
  except OSError:
    return ''
  start, end = text.find('['), text.find(']')
  return text[start + 1 : end] if 0 <= start < end else ''


def wanted(environ: dict[str, str] | None = None) -> bool:
  """Whether re-executing with the tunable would change anything here (the conditions in the docstring)."""
  environ = os.environ if environ is None else environ
  if environ.get(ENV_SWITCH, '1') == '0' or TUNABLE in environ.get('GLIBC_TUNABLES', ''):
    return False
  name, version = platform.libc_ver()
  glibc = name == 'glibc' and tuple(int(p) for p in version.split('.')[:2] if p.isdigit()) >= (2, 35)
  return sys.platform == 'linux' and glibc and _thp_mode() == 'madvise'


def environment(environ: dict[str, str] | None = None) -> dict[str, str]:
  """`environ` with the tunable added to any GLIBC_TUNABLES already there (colon-separated, as glibc reads them)."""
  env = dict(os.environ if environ is None else environ)
  tunables = [t for t in env.get('GLIBC_TUNABLES', '').split(':') if t]
  env['GLIBC_TUNABLES'] = ':'.join([*tunables, f'{TUNABLE}=1'])
  return env


def reexec_with_huge_pages() -> None:
  """Re-executes this process with the tunable when `wanted()`; call it before jax is imported."""
  if not wanted():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment())
