"""The errors a user can fix: one class per kind, derived from the builtin its raise sites used before, with its own
exit status (1: convert's historic one; 3-5: "diverged" and the AOT verdicts; the others from 10), and `reported`,
under which every command runs: an expected error is one line on stderr (`--debug`: the traceback)."""

from __future__ import annotations

import contextlib
import os
import sys


class NeobertError(Exception):
  """An expected failure naming the problem and the fix; subclasses declare exit_status and kind."""

  exit_status = 1
  kind = 'error'

  def __init_subclass__(cls, exit_status: int, kind: str, **kwargs):
    super().__init_subclass__(**kwargs)
    cls.exit_status, cls.kind = exit_status, kind


class ConfigError(NeobertError, ValueError, exit_status=2, kind='config error'):
  """A config (file, override or command-line flag) that cannot run; the message names the field."""


class DataError(NeobertError, ValueError, exit_status=10, kind='data error'):
  """Input text or prepared data that is missing, unreadable or does not match the model."""


class CheckpointError(NeobertError, RuntimeError, exit_status=11, kind='checkpoint error'):
  """A checkpoint that is missing, unreadable or does not fit the model."""


class ExportError(NeobertError, ValueError, exit_status=1, kind='export error'):
  """A conversion to or from Hugging Face that cannot be done as asked (target exists, tokenizer mismatch...)."""


class DistributedError(NeobertError, ValueError, exit_status=12, kind='distributed error'):
  """Multi-process start-up settings that are incomplete or contradictory."""


class StorageError(NeobertError, OSError, exit_status=13, kind='storage error'):
  """A place that cannot be read or written: a missing bucket, refused credentials, a read-only directory."""


class DownloadError(NeobertError, RuntimeError, exit_status=14, kind='download error'):
  """A file fetched once per machine from the package registry that could not be had."""


class InUseError(NeobertError, RuntimeError, exit_status=15, kind='in use'):
  """A workdir or `prepare` output that another live job writes (neobert_jax/lease.py)."""


class TrainingDiverged(FloatingPointError):
  """A non-finite loss or gradient under nan_policy 'stop' (the commands exit with status 3)."""


DEBUG_FLAG = '--debug'
DEBUG_ENV = 'NEOBERT_DEBUG'  # set by --debug so that child processes (the AOT compile child) inherit it


def take_debug_flag(argv: list[str]) -> bool:
  """Removes --debug from argv (anywhere) and says whether traceback mode is on (the flag, or NEOBERT_DEBUG=1)."""
  found = DEBUG_FLAG in argv
  argv[:] = [a for a in argv if a != DEBUG_FLAG]
  if found:
    os.environ[DEBUG_ENV] = '1'
  return found or os.environ.get(DEBUG_ENV) == '1'


def one_line(error: BaseException, first: bool = False, with_type: bool = False) -> str:
  """The message on one line (joined with ' | ', or only the `first`), `with_type` prefixed by `Type: `."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  text = (lines[0] if lines else '') if first else ' | '.join(lines)
  return f'{type(error).__name__}: {text}' if with_type else text or type(error).__name__


@contextlib.contextmanager
def reported(prog: str, debug: bool = False, also: dict[type[BaseException], type[NeobertError]] | None = None):
  """Runs the body; an expected error becomes one line on stderr and SystemExit with its status."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    mapped = next((cls for base, cls in (also or {}).items() if isinstance(e, base)), None)
    kind = type(e) if isinstance(e, NeobertError) else mapped
    if debug or kind is None:
      raise
    line = f'{prog}: {kind.kind}: {one_line(e)}'
    print(line, file=sys.stderr, flush=True)
    stop = SystemExit(line)
    stop.code = kind.exit_status
    raise stop from None
