"""A job run under a command's error reporting, in-process: what `python -m neobert_jax.<command>` does around its
job (errors.reported), without a process start. Tests call the jobs (neobert_jax/jobs/), never a __main__."""

from __future__ import annotations

from typing import Any, Callable

from neobert_jax import errors


def reported(command: str, job: Callable[..., Any], *args, **kwargs) -> tuple[int, Any]:
  """(exit status, the job's result): 0 and the result, or an expected error's status (its one line printed on
  stderr, as the command prints it) and None."""
  try:
    with errors.reported(command):
      return 0, job(*args, **kwargs)
  except SystemExit as e:
    return e.code, None
