"""Expected errors from the command line: one line on stderr naming the problem, the class's exit status, no traceback.

Most cases are real subprocesses (jax start-up included, a few seconds each), run in parallel in one test that
reports every failing case at once; the rest call prepare's and convert's main in-process, which is the same
reporting. Statuses: neobert_jax/errors.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neobert_jax import errors
from neobert_jax.jobs import convert as convert_job
from neobert_jax.data.prepare import local as prepare_lib
from tests.support import synthetic_data
from tests.support.commands import reported

REPO = Path(__file__).resolve().parents[1]
CONFIG, DATA, CHECKPOINT, EXPORT, DISTRIBUTED = (
  c.exit_status
  for c in (errors.ConfigError, errors.DataError, errors.CheckpointError, errors.ExportError, errors.DistributedError)
)
TRAIN = [sys.executable, '-m', 'neobert_jax.train', '--config=configs/tiny_cpu.py']
PREPARE = [sys.executable, '-m', 'neobert_jax.data.prepare', '--no-progress', '--workers=0']
CONVERT = [sys.executable, '-m', 'neobert_jax.convert']
# The console script's path (neobert-compile), which reports errors whatever compile.py's own __main__ does.
COMPILE = [
  sys.executable,
  '-c',
  'import sys; sys.argv[0] = "neobert-compile"; from neobert_jax import cli; cli.compile_main()',
  '--config=configs/tiny_cpu.py',
]


@pytest.fixture(scope='module')
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp('cli')
  vocab = synthetic_data.write_wordpiece_vocab(str(d / 'vocab.txt'), ['the', 'cat', 'sat'])
  (d / 'in.jsonl').write_text(json.dumps({'body': 'the cat sat'}) + '\n')
  (d / 'in.txt').write_text('the cat sat\n')
  (d / 'prepared').mkdir()
  (d / 'prepared' / 'manifest.json').write_text('{}')
  (d / 'broken.json').write_text('{"web": {"dir": "x", "weight": ')
  (d / 'neg.json').write_text(json.dumps({'web': {'dir': str(d / 'prepared'), 'weight': -1}}))
  return d, vocab


def _subprocess_cases(d: Path, vocab: str) -> list[tuple[str, list[str], int, str, dict]]:
  """(name, command, exit status, text the line must contain, extra environment)."""
  work = f'--workdir={d / "run"}'
  return [
    ('train: unknown override key', TRAIN + [work, '--config.train.num_step=3'], CONFIG, "'num_steps'", {}),
    (
      'train: renamed override key',
      TRAIN + [work, '--config.train.compute_dtype=bfloat16'],
      CONFIG,
      'train.compute_dtype is now model.dtype',
      {},
    ),
    ('train: missing config file', TRAIN[:-1] + ['--config=configs/nope.py', work], CONFIG, 'nope.py', {}),
    ('train: mesh does not fit the devices', TRAIN + [work, '--config.mesh.tensor=3'], CONFIG, 'tensor', {}),
    ('train: missing data directory', TRAIN + [work, f'--config.data.dir={d / "none"}'], DATA, 'does not exist', {}),
    (
      'train: incomplete multi-process settings',
      TRAIN + [work],
      DISTRIBUTED,
      'coordinator',
      {'NEOBERT_NUM_PROCESSES': '2', 'NEOBERT_PROCESS_ID': '0'},
    ),
    (
      'prepare: missing input',
      PREPARE + ['--input', str(d / 'gone.txt'), '--output', str(d / 'o1'), '--tokenizer', vocab],
      DATA,
      'no such file',
      {},
    ),
    (
      'convert: missing Hugging Face input',
      CONVERT + ['from-pytorch', '--input', str(d / 'none'), '--output', str(d / 'x.safetensors')],
      EXPORT,
      'no such file',
      {},
    ),
    ('compile: unknown target', COMPILE + ['--target=cuda:a100x8'], CONFIG, 'h100', {}),
    # The surfaces the recipes grew: mixtures, schedules, the batch ramp, EMA, the probe, wandb, the warmup knob.
    ('train: missing mixture file', TRAIN + [work, f'--config.data.mixture={d / "none.json"}'], CONFIG, 'no such', {}),
    ('train: mixture not JSON', TRAIN + [work, f'--config.data.mixture={d / "broken.json"}'], CONFIG, 'JSON', {}),
    ('train: negative mixture weight', TRAIN + [work, f'--config.data.mixture={d / "neg.json"}'], CONFIG, '-1', {}),
    ('train: unknown schedule', TRAIN + [work, '--config.optimizer.schedule=bogus'], CONFIG, 'wsd', {}),
    (
      'train: decay longer than the run',
      TRAIN + [work, '--config.optimizer.schedule=wsd', '--config.optimizer.wsd_decay_fraction=1.5'],
      CONFIG,
      'wsd_decay_fraction',
      {},
    ),
    (
      'train: batch ramp start does not divide',
      TRAIN + [work, '--config.train.batch_warmup_tokens=100000', '--config.train.batch_warmup_start=5'],
      CONFIG,
      'batch_warmup_start=5',
      {},
    ),
    ('train: EMA decay out of range', TRAIN + [work, '--config.train.ema_decay=1.5'], CONFIG, 'ema_decay', {}),
    (
      'train: EMA export without EMA',
      TRAIN + [work, '--config.train.ema_decay=0', '--config.export.use_ema=True'],
      CONFIG,
      'ema_decay > 0',
      {},
    ),
    ('train: unknown probe task', TRAIN + [work, '--config.eval.probe_task=nope'], CONFIG, 'probe_task', {}),
    ('train: negative warmup', TRAIN + [work, '--config.optimizer.warmup_steps=-1'], CONFIG, 'warmup_steps', {}),
    (
      'train: wandb online without a key',
      TRAIN + [work, '--config.logging.wandb=True'],
      CONFIG,
      'API key',
      {'WANDB_API_KEY': None, 'WANDB_MODE': None, 'NETRC': str(d / 'no-netrc')},
    ),
    (
      'train: unknown wandb mode',
      TRAIN + [work, '--config.logging.wandb=True', '--config.logging.wandb_mode=sometimes'],
      CONFIG,
      'offline',
      {},
    ),
    (
      'prepare: a hub dataset offline',
      PREPARE + ['--input', 'hf:nobody/nothing', '--output', str(d / 'o-hub'), '--tokenizer', vocab],
      DATA,
      'hf:nobody/nothing',
      {'HF_HUB_OFFLINE': '1'},
    ),
  ]


def _error_lines(stderr: str) -> list[str]:
  # The trainer logs its progress (INFO lines with a time stamp) on stderr before it meets an error.
  return [line for line in stderr.strip().splitlines() if not re.match(r'\d\d:\d\d:\d\d (INFO|WARNING) ', line)]


def _run(case):
  name, cmd, status, text, env = case
  env = {k: v for k, v in {**os.environ, 'NEOBERT_DEBUG': '0', **env}.items() if v is not None}
  r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
  problems = _problems(r.returncode, status, r.stderr, text)
  # Nothing written: neither the run's workdir nor a prepare's output is left behind.
  written = [a.split('=', 1)[1] for a in cmd if a.startswith('--workdir=')]
  written += [cmd[i + 1] for i, a in enumerate(cmd) if a == '--output' and 'neobert_jax.data.prepare' in cmd]
  problems += [f'{w} was written' for w in written if os.path.exists(w)]
  return name, problems, r.stderr[-1500:]


def _problems(code: int, status: int, stderr: str, text: str) -> list[str]:
  lines, problems = _error_lines(stderr), []
  if code != status:
    problems.append(f'exit status {code}, expected {status}')
  if len(lines) != 1 or 'Traceback' in stderr:
    problems.append(f'{len(lines)} lines on stderr')
  elif text not in lines[0]:
    problems.append(f'the line does not mention {text!r}')
  return problems


@pytest.mark.slow
def test_expected_errors_are_one_line_with_their_status(files):
  # Each case gets a workdir of its own: with one shared workdir, a case that writes it would be blamed on another.
  cases = [
    (name, [a.replace('/run', f'/run{i}') if a.startswith('--workdir=') else a for a in cmd], status, text, env)
    for i, (name, cmd, status, text, env) in enumerate(_subprocess_cases(*files))
  ]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    results = list(pool.map(_run, cases))
  failed = [f'{name}: {"; ".join(p)}\n{err}' for name, p, err in results if p]
  assert not failed, '\n\n'.join(failed)


def _prepare(argv: list[str], capsys) -> tuple[int, str]:
  with pytest.raises(SystemExit) as stop:
    prepare_lib.main(argv + ['--no-progress', '--workers=0'])
  return stop.value.code, capsys.readouterr().err


def _convert(checkpoint: Path, output: Path, capsys) -> tuple[int, str]:
  code, _ = reported('convert', convert_job.to_pytorch, str(checkpoint), str(output))
  return code, capsys.readouterr().err


def _export_finetuned(argv: list[str], capsys) -> tuple[int, str]:
  from neobert_jax.finetune import export  # pylint: disable=g-import-not-at-top

  code = export.main(argv)
  return code, capsys.readouterr().err


# The same reporting in-process (the subprocess cases above prove the module entry points; these save start-ups).
def test_more_expected_errors_in_process(files, capsys):
  d, vocab = files
  cases = [
    (
      'prepare: missing tokenizer',
      _prepare(['--input', str(d / 'in.txt'), '--output', str(d / 'o2'), '--tokenizer', str(d / 'nope.txt')], capsys),
      DATA,
      'nope.txt',
    ),
    (
      'prepare: no such JSONL field',
      _prepare(['--input', str(d / 'in.jsonl'), '--output', str(d / 'o3'), '--tokenizer', vocab], capsys),
      DATA,
      "no field 'text'",
    ),
    (
      'prepare: output holds prepared data',
      _prepare(['--input', str(d / 'in.txt'), '--output', str(d / 'prepared'), '--tokenizer', vocab], capsys),
      DATA,
      '--overwrite',
    ),
    (
      'convert: missing checkpoint',
      _convert(d / 'none', d / 'hf', capsys),
      EXPORT,
      'no such directory',
    ),
    (
      'convert: export target not empty',
      _convert(d / 'none', d / 'prepared', capsys),
      EXPORT,
      '--overwrite',
    ),
    (
      'export a fine-tuned model: not a fine-tuning run',
      _export_finetuned(['--run', str(d), '--output', str(d / 'ft')], capsys),
      EXPORT,
      'no config.json',
    ),
  ]
  failed = [
    f'{name}: {"; ".join(p)}\n{err}'
    for name, (code, err), status, text in cases
    if (p := _problems(code, status, err, text))
  ]
  assert not failed, '\n\n'.join(failed)


def test_debug_shows_the_traceback(files, monkeypatch):
  d, vocab = files
  monkeypatch.setenv(errors.DEBUG_ENV, '0')  # --debug sets it for child processes; undone after the test
  # In-process, --debug lets the error itself through (the interpreter then prints its traceback).
  with pytest.raises(errors.DataError, match='no such file'):
    prepare_lib.main(['--input', str(d / 'gone.txt'), '--output', str(d / 'o4'), '--tokenizer', vocab, '--debug'])
