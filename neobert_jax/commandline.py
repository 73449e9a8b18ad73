"""The command-line convention every command follows (docs/architecture.md, "Command-line conventions"): argparse
commands build a `Parser`, absl commands start through `run_absl`. Imports only errors (absl inside functions, so
an argparse command never loads it)."""

from __future__ import annotations

import argparse
import faulthandler
import functools
import logging
import os
import re
import sys
from typing import Callable, Sequence

from neobert_jax import errors

# argparse's two spellings; absl's others (--helpfull, -?) are unknown flags here, as on the argparse commands.
HELP_FLAGS = ('-h', '--help')
CONFIG = 'config'  # the config_flags flag of every command that has one: --config=FILE --config.a.b=v
DEBUG_HELP = 'on an expected error, show the traceback instead of one line'


class _Formatter(argparse.HelpFormatter):
  """argparse's layout with a short usage line (the required flags, then [flags]) and each flag's default."""

  def _format_usage(self, usage, actions, groups, prefix):
    shown = [a for a in actions if a.required or not a.option_strings]
    # One line however long: argparse wraps a usage line to the terminal; the flags are listed below it anyway.
    return ' '.join(super()._format_usage(usage, shown, [], prefix).split()) + ' [flags]\n\n'

  def _get_help_string(self, action):
    text = action.help or ''
    if action.option_strings and action.default not in (None, False, '', argparse.SUPPRESS):
      text += ' (default: %(default)s)'
    return text


class Parser(argparse.ArgumentParser):
  """An ArgumentParser under the convention: `doc`'s first paragraph describes it, the usage names it as typed."""

  def __init__(self, command: str = '', module: str = '', doc: str | None = None, **kwargs):
    self.command = command
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ''
    kwargs.setdefault('prog', script if script.startswith('neobert-') else f'python -m {module}')
    description = ' '.join((doc or '').strip().split('\n\n')[0].split())
    super().__init__(description=description, formatter_class=_Formatter, allow_abbrev=False, **kwargs)
    self._optionals.title = 'flags'
    self.add_argument('--debug', action='store_true', help=DEBUG_HELP)

  def add_subparsers(self, **kwargs):
    kwargs.setdefault('title', 'commands')
    kwargs.setdefault('prog', self.prog)  # argparse would build it from the usage line, flags included
    kwargs.setdefault('parser_class', functools.partial(Parser, self.command))
    return super().add_subparsers(**kwargs)

  def parse_args(self, args: Sequence[str] | None = None, namespace=None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if args is None else args)
    debug = errors.take_debug_flag(argv)  # anywhere on the line, before or after a subcommand
    # argparse names missing required flags before unknown ones; a mistyped flag is the likelier fault, name it.
    known, flags = self._option_strings(), argv[: argv.index('--') if '--' in argv else None]
    unknown = [a for a in flags if re.match(r'-[^\d]', a) and a.split('=', 1)[0] not in known]
    if unknown:
      self.error(f'unrecognized arguments: {" ".join(unknown)}')
    parsed = super().parse_args(argv, namespace)
    parsed.debug = debug
    return parsed

  def _option_strings(self) -> set[str]:
    """Every flag this parser or one of its subcommands takes."""
    known = set(self._option_string_actions)
    for action in self._actions:
      if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
        for sub in action.choices.values():
          known |= sub._option_strings()
    return known

  def error(self, message: str):
    # argparse's own report is the usage and a second line, with status 2; the convention is one line.
    with errors.reported(self.command, errors.take_debug_flag([])):
      raise errors.ConfigError(f'{message} (see --help)')


def configure_logging(level: int = logging.INFO) -> None:
  """Every training command's log format at `level`; absl (Orbax, Grain) only from WARNING."""
  logging.basicConfig(level=level, format='%(asctime)s %(levelname)s %(message)s', datefmt='%H:%M:%S', force=True)
  logging.getLogger('absl').setLevel(logging.WARNING)


def run_absl(
  command: str,
  module: str,
  doc: str | None,
  flag_values,
  main: Callable[[list[str]], int],
  required: Sequence[str] = (),
  fields_doc: str = '',
  renamed: Callable[[str], errors.ConfigError | None] | None = None,
) -> None:
  """Parses sys.argv with `flag_values`, runs main(argv) under errors.reported, exits with its status."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  debug = errors.take_debug_flag(sys.argv)  # before absl sees the line: --debug is not an absl flag here
  with errors.reported(command, debug):
    if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
      print(absl_help(command, module, doc, flag_values, required), end='')
      sys.exit(0)
    flags.mark_flags_as_required(list(required), flag_values=flag_values)
    argv = _parse_absl(flag_values, sys.argv, fields_doc, renamed)
    if len(argv) > 1:
      raise errors.ConfigError(f'unexpected arguments {argv[1:]}; flags take the form --name=value (see --help)')
    # What absl's app.run did besides parsing: libraries that read absl's global flags (Grain's config) get their
    # defaults instead of an unparsed-flag error, and a crash in native code (XLA) prints the Python stack.
    flags.FLAGS.mark_as_parsed()
    faulthandler.enable()
    status = main(argv)
  sys.exit(status)


def absl_help(command: str, module: str, doc: str | None, flag_values, required: Sequence[str] = ()) -> str:
  """The help of absl flags in the Parser layout: each flag becomes an argparse argument that is only printed."""
  parser = Parser(command, module, doc)
  for name in list(flag_values):
    flag = flag_values[name]
    if name != flag.name or '.' in name:  # a short alias, or an override registered by an earlier parse
      continue
    text = (flag.help or '').replace('%', '%%')
    if flag.boolean:
      parser.add_argument(f'--{name}', action='store_true', help=text)
      continue
    default = ','.join(flag.default) if isinstance(flag.default, list) else flag.default
    choices = getattr(flag.parser, 'enum_values', None)
    if choices:  # argparse shows them as {a,b}; absl's help text starts with <a|b>:
      text = text.removeprefix(f'<{"|".join(choices)}>: ')
    parser.add_argument(
      f'--{name}',
      metavar='FILE' if name == CONFIG else None if choices else name.upper(),
      choices=choices,
      default=default,
      required=name in required,
      help=text,
    )
    if name == CONFIG:
      parser.add_argument(
        f'--{CONFIG}.FIELD',
        metavar='VALUE',
        help=f'set one field of the config file (--{CONFIG}.SECTION.FIELD=VALUE; any number of them)',
      )
  return parser.format_help()


def _parse_absl(flag_values, argv: list[str], fields_doc: str, renamed) -> list[str]:
  """flag_values(argv), where a bad flag, override or config file is one ConfigError (not absl's tracebacks)."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  try:
    rest = flag_values(argv)
    if CONFIG in flag_values and flag_values[CONFIG].value is not None:
      flag_values[CONFIG].value.keys()  # config_flags defers a file that failed to load until the first access
    return rest
  except flags.Error as e:
    raise errors.ConfigError(f'{errors.one_line(e)} (see --help)') from e
  except OSError as e:  # a config file that does not load (its last line says why)
    file = next((a for a in argv if a.startswith(f'--{CONFIG}=')), f'--{CONFIG}')
    raise errors.ConfigError(f'{file}: {str(e).strip().splitlines()[-1].strip()}') from e
  except (AttributeError, KeyError) as e:  # ml_collections: an override names a field the config lacks
    for arg in argv:  # a field that moved: name its new home
      if renamed and arg.startswith(f'--{CONFIG}.'):
        moved = renamed(arg.partition('=')[0].removeprefix(f'--{CONFIG}.'))
        if moved is not None:
          raise moved from e
    text = errors.one_line(e).replace('\\n', ' ').replace("\\'", "'")
    key, hint = re.search(r"'(\w+)'", text), re.search(r'Did you mean "(\w+)"', text)
    raise errors.ConfigError(
      'a --config.* override names a field the config does not have'
      f'{f" ({key.group(1)!r})" if key else ""}; {f"did you mean {hint.group(1)!r}? " if hint else ""}'
      f'every field is listed in {fields_doc or "the config file"}'
    ) from e
