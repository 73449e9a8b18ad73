"""Host memory: glibc's malloc on transparent huge pages for the training commands, by re-executing once.

Why: XLA's CPU runtime allocates every step's temporary and output buffers afresh, and glibc serves blocks that
large with a new mmap each time, so each step faults in its buffers again 4 KiB at a time. On the main job (a
1 x 128 model on 2 cores) that was ~29,000 page faults per step and a quarter of its CPU time in the kernel.
With `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc 2.35+) malloc asks for transparent huge pages, 2 MiB at a
time: ~20x fewer faults and ~15% less CPU per step (docs/performance.md, "Huge pages"). The setting is read
when the process starts, so the command re-executes itself once with it, before anything heavy is imported.
On accelerators it is harmless: host buffers only.

Nothing happens when: not Linux with glibc 2.35+; the kernel's THP mode is not `madvise` (with `always` pages
are already huge, with `never` there are none); the tunable is already set (this is the re-executed process, or
the user chose); or NEOBERT_JAX_HUGE_PAGES=0.

Owns: that decision and the re-exec. Imports nothing of ours.
"""

from __future__ import annotations

import os
import platform
import sys

ENV_SWITCH = 'NEOBERT_JAX_HUGE_PAGES'  # '0' keeps the process as started
TUNABLE = 'glibc.malloc.hugetlb'
_THP_MODE = '/sys/kernel/mm/transparent_hugepage/enabled'


def _glibc_at_least(major: int, minor: int) -> bool:
  name, version = platform.libc_ver()
  if name != 'glibc' or not version:
    return False
  parts = tuple(int(p) for p in version.split('.')[:2] if p.isdigit())
  return parts >= (major, minor)


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
  return sys.platform == 'linux' and _glibc_at_least(2, 35) and _thp_mode() == 'madvise'


def environment(environ: dict[str, str] | None = None) -> dict[str, str]:
  """`environ` with the tunable added to any GLIBC_TUNABLES already there (colon-separated, as glibc reads them)."""
  env = dict(os.environ if environ is None else environ)
  tunables = [t for t in env.get('GLIBC_TUNABLES', '').split(':') if t]
  env['GLIBC_TUNABLES'] = ':'.join([*tunables, f'{TUNABLE}=1'])
  return env


def reexec_with_huge_pages() -> None:
  """Replaces this process (same pid, arguments and environment plus the tunable) when `wanted()`; else returns.

  Call it first thing in a command's entry point, before jax is imported: the process is started over."""
  if not wanted():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment())
