"""host_memory: the decision to re-execute with glibc's huge-page malloc, and the re-exec itself (a real process)."""

import os
import subprocess
import sys

from neobert_jax import host_memory


def test_the_tunable_joins_those_already_set_and_stops_a_second_reexec():
  env = host_memory.environment({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2', 'HOME': '/x'})
  assert env['GLIBC_TUNABLES'] == 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1' and env['HOME'] == '/x'
  assert host_memory.environment({})['GLIBC_TUNABLES'] == 'glibc.malloc.hugetlb=1'
  assert not host_memory.wanted(env)  # the re-executed process does not start over again
  assert not host_memory.wanted({host_memory.ENV_SWITCH: '0'})


_PROBE = (
  'import os, sys; pid = os.getpid(); from neobert_jax import host_memory; '
  'host_memory.reexec_with_huge_pages(); print(pid, os.environ.get("GLIBC_TUNABLES", ""), sys.argv[1:])'
)


def test_the_command_restarts_once_in_place_with_its_arguments_where_it_helps():
  env = {k: v for k, v in os.environ.items() if k not in ('GLIBC_TUNABLES', host_memory.ENV_SWITCH)}
  out = subprocess.run(
    [sys.executable, '-c', _PROBE, '--flag=1'], env=env, capture_output=True, text=True, check=True
  ).stdout.split(maxsplit=1)
  pid, rest = int(out[0]), out[1]
  # execve keeps the pid; the printed pid is the one the restarted process found, so it is printed once, last
  assert pid > 0 and rest.rstrip().endswith("['--flag=1']") and len(out) == 2
  assert ('glibc.malloc.hugetlb=1' in rest) == host_memory.wanted(env)
  off = subprocess.run(
    [sys.executable, '-c', _PROBE], env={**env, host_memory.ENV_SWITCH: '0'}, capture_output=True, text=True, check=True
  ).stdout
  assert 'hugetlb' not in off
