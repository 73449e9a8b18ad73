"""The errors a user can fix, one class per kind, each with its own exit status, and `reported`, under which every
command's main runs: an expected error is one line on stderr naming the problem and the fix (`--debug` shows the
traceback). Imports nothing from the package. Each class derives from the builtin its raise sites used before; 1 is
the convert command's historic status, 3-5 the trainer's "diverged" and the AOT verdicts, so the others start at 10."""

from __future__ import annotations

import contextlib
import os
import sys


class NeobertError(Exception):
  """An expected failure whose message names the problem and the fix; the CLI prints it as one line. Each kind
  declares its exit status and the word the CLI prints before the message as class arguments."""

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
  """A file fetched once per machine from the package registry (the bert-base-uncased vocabulary, the built-in
  corpus, the evaluation data) that could not be had: the registry unreachable, or a package not as pinned."""


class InUseError(NeobertError, RuntimeError, exit_status=15, kind='in use'):
  """A workdir or `prepare` output that another live job writes (its lease, neobert_jax/lease.py, names it), or
  one whose lease this job lost to another."""


class TrainingDiverged(FloatingPointError):
  """The loss or gradient norm became NaN/inf under nan_policy 'stop'; the message names the last good checkpoint.
  Not a user error of the kinds above: the commands exit with status 3 for it."""


ALL = tuple(NeobertError.__subclasses__())  # every kind, in the order above


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
  """Runs the body; an expected error (or a builtin that `also` maps to a class) becomes one line on stderr and
  SystemExit(line) with the class's status. With debug it propagates."""
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
