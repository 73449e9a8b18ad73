"""The fault matrix (docs/fault-matrix.md): the faults no other test injects, each with its expected outcome.

Outcomes: resumed bit-identical; stopped with one line and the last good checkpoint kept; refused with one line.
Nothing good may be overwritten or renamed without a loud message. Rows proven elsewhere (crash / SIGTERM and
resume, a corrupt latest checkpoint, SIGTERM on one of two processes, another process count, a killed prepare) are
listed in docs/fault-matrix.md with their tests and not repeated here.

One small run (synthetic data, a 1000-id vocabulary: a checkpoint is about 1 MB) is trained once per module; each
row works on a copy of it. Subprocesses only where a kill -9 needs a process to kill. This file is also that
process: `python tests/test_scenario_fault_matrix.py train|export-write|export-swap ...`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from neobert_jax import errors
from neobert_jax.convert import export_hf
from tests.support import synthetic_data
from neobert_jax.weights import runs
from neobert_jax.jobs import pretrain as pretrain_job
from tests.support.tiny_train import kill_when_paused, tiny_config, train_only

REPO = Path(__file__).resolve().parents[1]
VOCAB, STEPS = 1000, 8
STATUSES = {cls.exit_status for cls in errors.NeobertError.__subclasses__()}


def _cfg(data_dir: str | Path, every: int = 2):
  cfg = tiny_config(vocab_size=VOCAB, steps=STEPS)
  cfg.data.dir = str(data_dir)
  cfg.checkpoint.every_steps, cfg.checkpoint.keep = every, 10  # keep every step: rows pick one to damage
  return cfg


def _make_data(directory: Path) -> None:
  docs = synthetic_data.synthetic_documents(200, seed=0, max_len=120, vocab_size=VOCAB)
  held_out = synthetic_data.synthetic_documents(20, seed=1, max_len=120, vocab_size=VOCAB)
  synthetic_data.write_prepared(str(directory), docs, held_out, vocab_size=VOCAB, max_length=128)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp('prepared')
  _make_data(d)
  return d


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  """The uninterrupted run: checkpoints at steps 2, 4, 6 and 8."""
  workdir = tmp_path_factory.mktemp('reference')
  assert train_only(_cfg(data_dir), workdir).final_step == STEPS
  return workdir


def _assert_same_params(workdir: Path, other: Path, step: int | None = None) -> None:
  """Both runs' parameters at `step` (default: each one's latest) are bit-identical."""
  (_, a), (_, b) = runs.restore_params(workdir, step), runs.restore_params(other, step)
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _copy_run(src: Path, dst: Path, upto: int = STEPS) -> Path:
  """`src` as it stood at step `upto`: its later checkpoints left out."""

  def later(directory, names):
    return [n for n in names if Path(directory).name == 'checkpoints' and n.isdigit() and int(n) > upto]

  shutil.copytree(src, dst, ignore=later, dirs_exist_ok=True)
  return dst


def _run_reported(run) -> tuple[int | BaseException | None, str]:
  """Runs `run()` as a command's main does (errors.reported); (exit status, or the exception a user would see as a
  traceback, or None for success; what went to stderr)."""
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      with errors.reported('train'):
        run()
    except SystemExit as e:
      return e.code, err.getvalue()
    except Exception as e:  # noqa: BLE001 - exactly what the row must not produce: a traceback
      return e, err.getvalue()
  return None, err.getvalue()


def _assert_one_line(outcome, stderr: str, *words: str) -> str:
  code = outcome
  assert isinstance(code, int) and code in STATUSES, f'a traceback, not one line: {code!r}'
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and 'Traceback' not in stderr, stderr
  for w in words:
    assert w in lines[0], (w, lines[0])
  return lines[0]


def _tree_digest(root: Path) -> dict[str, str]:
  return {
    str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob('*')) if p.is_file()
  }


def _pages(root: Path) -> int:
  """Bytes `root`'s files take on a tmpfs (whole 4 KiB pages)."""
  return sum(-(-p.stat().st_size // 4096) * 4096 for p in root.rglob('*') if p.is_file())


@contextlib.contextmanager
def _tmpfs(path: Path, size_bytes: int):
  """A tmpfs of `size_bytes` at `path` (root only: skips with the reason otherwise)."""
  path.mkdir(parents=True, exist_ok=True)
  try:
    r = subprocess.run(
      ['mount', '-t', 'tmpfs', '-o', f'size={size_bytes // 1024}k', 'tmpfs', str(path)], capture_output=True, text=True
    )
  except FileNotFoundError:
    pytest.skip('no mount command: cannot make a small or read-only filesystem')
  if r.returncode:
    pytest.skip(f'cannot mount a tmpfs (needs root): {r.stderr.strip()}')
  try:
    yield path
  finally:
    subprocess.run(['umount', '-l', str(path)], check=False)


def _remount(path: Path, options: str) -> None:
  subprocess.run(['mount', '-o', f'remount,{options}', str(path)], check=True)


# ------------------------------------------------------------------------------------- kill -9 during an async save


@pytest.mark.slow
def test_kill_9_during_an_async_save_resumes_bit_identical(data_dir, reference, tmp_path):
  """SIGKILL while Orbax writes a step in the background (its temporary directory exists): the half-written step is
  never used, the same command resumes from the last complete one and ends with the uninterrupted run's params."""
  workdir = tmp_path / 'run'
  log = tmp_path / 'child.log'
  with open(log, 'w') as out:
    child = subprocess.Popen(
      [sys.executable, __file__, 'train', str(data_dir), str(workdir)],
      cwd=REPO,
      stdout=out,
      stderr=subprocess.STDOUT,
      env=dict(os.environ, PYTHONUNBUFFERED='1', PYTHONPATH=str(REPO)),
    )
  checkpoints = workdir / 'checkpoints'
  deadline, names = time.time() + 240, []
  try:
    while time.time() < deadline and child.poll() is None:
      names = os.listdir(checkpoints) if checkpoints.is_dir() else []
      # A complete step to fall back on, and the next one half-written.
      if any(n.isdigit() for n in names) and any('orbax-checkpoint-tmp' in n for n in names):
        child.send_signal(signal.SIGKILL)
        break
      time.sleep(0.002)
  finally:
    child.kill()
    child.wait()
  assert child.returncode == -signal.SIGKILL, log.read_text()[-3000:]
  left = os.listdir(checkpoints)
  assert any('orbax-checkpoint-tmp' in n for n in left), left  # the kill did land mid-save
  complete = runs.latest_step(workdir)
  assert complete is not None and complete < STEPS, left

  result = train_only(_cfg(data_dir, every=1), workdir)  # the same command again
  assert result.final_step == STEPS
  _assert_same_params(workdir, reference)
  assert not [n for n in os.listdir(checkpoints) if 'orbax-checkpoint-tmp' in n or 'corrupt' in n]


# ----------------------------------------------------------------------------------------- kill -9 during the export


@pytest.fixture
def good_export(reference, tmp_path):
  out = export_hf.export_checkpoint(reference, tmp_path / 'exports' / 'hf')
  return out, _tree_digest(out)


def _kill_export_at(mode: str, reference: Path, out: Path) -> int:
  """Re-exports `reference` over `out` in a child that pauses at `mode`'s point (after the real call) to be
  SIGKILLed there; returns the child's pid."""
  return kill_when_paused(
    [sys.executable, __file__, mode, str(reference), str(out)],
    env=dict(os.environ, PYTHONUNBUFFERED='1', PYTHONPATH=str(REPO)),
    cwd=REPO,
  )


def _visible(parent: Path) -> list[str]:
  return sorted(p.name for p in parent.iterdir() if not p.name.startswith('.'))


@pytest.mark.slow
def test_kill_9_while_writing_an_export_keeps_the_previous_one(reference, good_export, capfd):
  out, digest = good_export
  pid = _kill_export_at('export-write', reference, out)
  # The previous export is untouched and nothing half-written is visible; the unfinished one is hidden.
  assert _visible(out.parent) == ['hf'] and _tree_digest(out) == digest
  hidden = [p.name for p in out.parent.iterdir() if p.name.startswith('.')]
  assert len(hidden) == 1 and hidden[0].startswith(f'.hf.tmp-{pid}-'), hidden
  # The next export (here: its first step) removes the leftover and says so.
  export_hf.check_output_dir(out, overwrite=True)
  assert f'removed {out.parent / hidden[0]}, left behind by an interrupted export (process {pid})' in (
    capfd.readouterr().err
  )
  assert sorted(p.name for p in out.parent.iterdir()) == ['hf'] and _tree_digest(out) == digest


@pytest.mark.slow
def test_kill_9_while_swapping_an_export_in_restores_the_previous_one(reference, good_export, capfd):
  """The one moment of a replacement when neither export sits at `out`: the previous one has been moved aside,
  the new one not yet moved in. The next export moves the previous one back, loudly, before anything else."""
  out, digest = good_export
  pid = _kill_export_at('export-swap', reference, out)
  assert _visible(out.parent) == []  # no export visible, so none that is half-written
  with pytest.raises(errors.ExportError, match='--overwrite'):  # the previous export is back, and kept
    export_hf.check_output_dir(out, overwrite=False)
  err = capfd.readouterr().err
  assert f'restored {out} from {out.parent}/.hf.old-{pid}-' in err, err
  assert f'left behind by an interrupted export (process {pid})' in err, err  # the finished new one, removed
  assert sorted(p.name for p in out.parent.iterdir()) == ['hf'] and _tree_digest(out) == digest


# ------------------------------------------------------------------------------------------ disk full while saving


@pytest.fixture(scope='module')
def disk_full(data_dir, reference, tmp_path_factory):
  """A run at step 4 resumed on a tmpfs with room for half a checkpoint more: the save of step 6 runs out of space.
  Yields (outcome, stderr, workdir, digest of checkpoint 4 before the run); the tmpfs stays mounted until the
  module's rows are done."""
  workdir = tmp_path_factory.mktemp('disk_full') / 'run'
  staged = _copy_run(reference, tmp_path_factory.mktemp('staged'), upto=4)
  size = _pages(staged) + _pages(reference / 'checkpoints' / '4') // 2
  with _tmpfs(workdir, size):
    shutil.copytree(staged, workdir, dirs_exist_ok=True)
    before = _tree_digest(workdir / 'checkpoints' / '4')
    outcome, stderr = _run_reported(lambda: pretrain_job.pretrain(_cfg(data_dir), workdir))
    yield outcome, stderr, workdir, before


@pytest.mark.slow
def test_disk_full_keeps_the_last_good_checkpoint(data_dir, reference, disk_full):
  outcome, stderr, workdir, before = disk_full
  assert outcome is not None, 'the run did not notice the full disk'
  assert runs.latest_step(workdir) == 4
  assert _tree_digest(workdir / 'checkpoints' / '4') == before
  # Once there is room again, the same command resumes from it and ends where the uninterrupted run did.
  _remount(workdir, 'size=64m')
  assert train_only(_cfg(data_dir), workdir).final_step == STEPS
  _assert_same_params(workdir, reference)


@pytest.mark.slow
def test_disk_full_stops_with_one_line_naming_the_last_good_checkpoint(disk_full):
  outcome, stderr, workdir, _ = disk_full
  _assert_one_line(outcome, stderr, 'No space left on device', f'{workdir / "checkpoints"}/4')


# ------------------------------------------------------------------------------------------- a read-only workdir


@pytest.fixture(scope='module')
def read_only(data_dir, reference, tmp_path_factory):
  """A run at step 4 on a filesystem remounted read-only: (outcome, stderr, workdir, digest before the run)."""
  workdir = tmp_path_factory.mktemp('read_only') / 'run'
  with _tmpfs(workdir, 64 << 20):
    _copy_run(reference, workdir, upto=4)
    before = _tree_digest(workdir)
    _remount(workdir, 'ro')
    outcome, stderr = _run_reported(lambda: pretrain_job.pretrain(_cfg(data_dir), workdir))
    yield outcome, stderr, workdir, before


def test_read_only_workdir_loses_nothing(reference, read_only):
  outcome, _, workdir, before = read_only
  assert outcome is not None, 'the run did not notice the read-only workdir'
  assert _tree_digest(workdir) == before
  assert runs.latest_step(workdir) == 4
  _assert_same_params(workdir, reference, step=4)


def test_read_only_workdir_is_refused_with_one_line(read_only):
  outcome, stderr, workdir, _ = read_only
  _assert_one_line(outcome, stderr, 'Read-only file system', str(workdir))


# ------------------------------------------------------------------------ a truncated shard, a corrupted manifest


def _truncate(path: Path) -> None:
  raw = path.read_bytes()
  path.write_bytes(raw[: len(raw) // 2])


def _drop_a_shard_size(path: Path) -> None:
  manifest = json.loads(path.read_text())
  del manifest['splits']['train']['shards'][0]['bytes']
  path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
  'damage,target',
  [
    (_truncate, 'train-00000.arrayrecord'),
    (_truncate, 'eval-00000.arrayrecord'),  # read only at evaluations: checked before the first step all the same
    (_truncate, 'manifest.json'),
    (_drop_a_shard_size, 'manifest.json'),  # still JSON
  ],
  ids=['train shard truncated', 'eval shard truncated', 'manifest truncated', 'manifest field lost'],
)
def test_damaged_data_is_refused_with_one_line_before_training(damage, target, tmp_path):
  data = tmp_path / 'prepared'
  _make_data(data)
  damage(data / target)
  workdir = tmp_path / 'run'
  outcome, stderr = _run_reported(lambda: pretrain_job.pretrain(_cfg(data), workdir))
  line = _assert_one_line(outcome, stderr, str(data / target), 'prepare it again')
  assert outcome == errors.DataError.exit_status, line
  assert not workdir.exists()  # refused before anything was written, let alone trained


# ----------------------------------------------------------------------- a checkpoint with one array file removed


def test_checkpoint_missing_one_array_file_falls_back_loudly_and_resumes_bit_identical(
  data_dir, reference, tmp_path, caplog
):
  workdir = _copy_run(reference, tmp_path / 'run')
  files = sorted((workdir / 'checkpoints' / '8' / 'params').rglob('d/*'), key=lambda p: p.stat().st_size)
  files[-1].unlink()  # the largest array data file of the latest step
  caplog.set_level(logging.WARNING)
  assert train_only(_cfg(data_dir), workdir).final_step == STEPS
  assert 'checkpoint step 8' in caplog.text and 'falling back to step 6' in caplog.text
  # Set aside under a new name with a loud message naming it, never deleted.
  assert [
    r
    for r in caplog.records
    if r.levelno >= logging.WARNING and f'{workdir / "checkpoints"}/8.corrupt' in r.getMessage()
  ], caplog.text
  assert (workdir / 'checkpoints' / '8.corrupt' / 'params').is_dir()
  _assert_same_params(workdir, reference)  # steps 7 and 8 replayed exactly


def test_latest_step_with_a_damaged_config_copy_is_set_aside_like_damaged_arrays(data_dir, reference, tmp_path, caplog):
  """The config saved with a step is part of it: a latest step whose copy cannot be read (truncated JSON) is set
  aside as `<step>.corrupt`, loudly, and the previous step is used; the run ends bit-identical (it used to be
  refused with "Fix it", about a file of Orbax's that a user cannot fix)."""
  workdir = _copy_run(reference, tmp_path / 'run')
  metadata = workdir / 'checkpoints' / '8' / 'config' / 'metadata'
  metadata.write_text(metadata.read_text()[:20])
  caplog.set_level(logging.WARNING)
  assert train_only(_cfg(data_dir), workdir).final_step == STEPS
  assert 'its copy of the config could not be read' in caplog.text and 'falling back to step 6' in caplog.text
  assert f'{workdir / "checkpoints"}/8.corrupt' in caplog.text
  assert (workdir / 'checkpoints' / '8.corrupt' / 'config' / 'metadata').read_text() == metadata.read_text()[:20]
  _assert_same_params(workdir, reference)  # steps 7 and 8 replayed exactly


# ------------------------------------------------------------------------------------------------- child processes


def _child_train(data_dir: str, workdir: str) -> None:
  train_only(_cfg(data_dir, every=1), workdir)  # a checkpoint every step: a save is nearly always under way


def _child_export(mode: str, checkpoint: str, out: str) -> None:
  """Re-exports over `out` and pauses, after the real call, at the point the parent kills: when the weights
  file is written (export-write), or when the previous export has been moved aside (export-swap)."""

  def pause():
    print('PAUSED', flush=True)
    time.sleep(600)

  if mode == 'export-write':
    real_save = export_hf.save_file

    def save_file(*args, **kwargs):
      real_save(*args, **kwargs)
      pause()

    export_hf.save_file = save_file
  else:
    real_rename = os.rename

    def rename(src, dst, **kwargs):
      real_rename(src, dst, **kwargs)
      if Path(src) == Path(out):
        pause()

    os.rename = rename
  export_hf.export_checkpoint(checkpoint, out, overwrite=True)


if __name__ == '__main__':
  mode, args = sys.argv[1], sys.argv[2:]
  if mode == 'train':
    _child_train(*args)
  elif mode in ('export-write', 'export-swap'):
    _child_export(mode, *args)
  else:
    raise SystemExit(f'unknown mode {mode}')
