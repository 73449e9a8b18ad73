"""The engine's checkpoints (neobert_jax/engine/checkpoint.py) on a small hand-made state, one device: a step's
arrays and data position saved and restored, the step protocol (newest complete step first, a half-written one never
listed), an unreadable step set aside (weights/runs.set_aside), a checkpoint that does not fit refused and left in
place, and a storage error retried on the bucket's budget and then raised, the checkpoint left alone.

The whole-run scenarios (kill -9 and resume bit for bit, another mesh, a damaged config copy) are in
tests/test_train_resume.py and tests/test_scenario_fault_matrix.py.
"""

from __future__ import annotations

import logging
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from neobert_jax import bucket, errors
from neobert_jax.engine import checkpoint as ckpt
from neobert_jax.weights import runs


class _Counted:
  """A data position of the smallest kind: a number, saved as a step's JSON item. The engine only calls it."""

  def __init__(self, at: int = 0):
    self.at = at
    self.restored_from = None

  def save_arg(self):
    return ocp.args.JsonSave({'at': self.at})

  def restore(self, item, step):
    self.restored_from = (item, step)
    if not item.is_dir():
      return False
    self.at = ocp.JsonCheckpointHandler().restore(item)['at']
    return True


def _state(seed: int, width: int = 3):
  params = nnx.state(nnx.Linear(4, width, rngs=nnx.Rngs(seed)), nnx.Param)
  opt = {'step': jnp.asarray(seed, jnp.int32), 'mu': {'kernel': jnp.full((4, width), float(seed))}}
  return {'params': params, 'opt': opt}


def _flat(state):
  return {k: np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state['params']))[0]}


_CFG = ml_collections.ConfigDict({'model': {'hidden_size': 3}})


def _saved(workdir, steps=(1, 2)):
  """A run in `workdir` with a step per entry of `steps`, state seeded by the step, data position 10 * step."""
  mngr = ckpt.make_manager(workdir, keep=5, async_save=False)
  for step in steps:
    ckpt.save(mngr, step, _state(step), _Counted(10 * step), _CFG)
  ckpt.finish(mngr)
  return mngr


def test_a_step_saves_and_restores_its_arrays_and_its_data_position(tmp_path):
  mngr = _saved(tmp_path)
  step_dir = runs.step_dir(tmp_path, 2)
  assert {p.name for p in step_dir.iterdir()} >= {runs.PARAMS_ITEM, runs.OPT_ITEM, runs.DATA_ITEM, runs.CONFIG_ITEM}
  position = _Counted()
  step, state = ckpt.restore_latest(mngr, _state(0), position)
  assert step == 2 and position.at == 20 and position.restored_from == (step_dir / runs.DATA_ITEM, 2)
  for (k, want), got in zip(_flat(_state(2)).items(), _flat(state).values()):
    np.testing.assert_array_equal(got, want, err_msg=str(k))
  assert int(state['opt']['step']) == 2 and float(state['opt']['mu']['kernel'][0, 0]) == 2.0
  assert runs.read_config(tmp_path, 2).model.hidden_size == 3
  ckpt.close(mngr)


def test_a_half_written_step_is_never_listed_and_an_empty_workdir_restores_nothing(tmp_path):
  empty = ckpt.make_manager(tmp_path / 'empty', async_save=False)
  assert ckpt.restore_latest(empty, _state(0), _Counted()) is None
  mngr = _saved(tmp_path / 'run')
  # A crash mid-save leaves only Orbax's temporary directory.
  (runs.checkpoint_dir(tmp_path / 'run') / '9.orbax-checkpoint-tmp-123' / runs.PARAMS_ITEM).mkdir(parents=True)
  assert sorted(runs.checkpoint_steps(tmp_path / 'run')) == [1, 2] and runs.latest_step(tmp_path / 'run') == 2
  mngr.reload()
  assert ckpt.restore_latest(mngr, _state(0), None)[0] == 2
  ckpt.close(mngr)


def test_an_unreadable_step_is_set_aside_loudly_and_the_previous_one_restored(tmp_path, caplog):
  mngr = _saved(tmp_path)
  cdir = runs.checkpoint_dir(tmp_path)
  params = tmp_path / 'checkpoints' / '2' / runs.PARAMS_ITEM
  (params / 'manifest.ocdbt').write_bytes(b'')  # the array index truncated and its data gone, the metadata intact
  for sub in ('d', 'ocdbt.process_0'):
    shutil.rmtree(params / sub)
  caplog.set_level(logging.WARNING)
  position = _Counted()
  step, _ = ckpt.restore_latest(mngr, _state(0), position)
  assert step == 1 and position.at == 10
  assert 'checkpoint step 2' in caplog.text and 'falling back to step 1' in caplog.text
  assert f'renamed to {cdir}/2.corrupt' in caplog.text
  assert (cdir / '2.corrupt').is_dir() and sorted(runs.checkpoint_steps(tmp_path)) == [1]
  # The same number set aside again (a later save of step 2 that is damaged too) keeps the first one.
  (cdir / '2').mkdir()
  assert runs.set_aside(tmp_path, 2, 'damaged again') == 1
  assert (cdir / '2.corrupt1').is_dir() and (cdir / '2.corrupt').is_dir()
  ckpt.close(mngr)


def test_a_checkpoint_that_does_not_fit_is_refused_in_one_line_and_left_in_place(tmp_path):
  mngr = _saved(tmp_path)
  before = sorted(p.name for p in runs.checkpoint_dir(tmp_path).iterdir())
  with pytest.raises(
    errors.ConfigError, match=r'(?s)checkpoint step 2 .*\(params\).*expected shape \(5,\), got \(3,\)'
  ):
    ckpt.restore_latest(mngr, _state(0, width=5), _Counted())
  assert sorted(p.name for p in runs.checkpoint_dir(tmp_path).iterdir()) == before
  # A params-only step (fine-tuning's best) cannot give a new stage its optimizer state.
  ckpt.save(mngr, 3, _state(3), None, _CFG, with_optimizer=False)
  ckpt.finish(mngr)
  with pytest.raises(errors.ConfigError, match='holds no optimizer state'):
    ckpt.restore_stage(runs.checkpoint_dir(tmp_path), 3, _state(0), None, optimizer=True, data=False)
  ckpt.close(mngr)


def test_a_storage_error_is_retried_on_the_bucket_budget_then_raised_and_the_checkpoint_left_alone(
  tmp_path, monkeypatch
):
  mngr = _saved(tmp_path)
  monkeypatch.setenv(bucket.ENV_WINDOW, '0.05')
  attempts = []

  def unreachable_storage(step, *args, **kwargs):
    attempts.append(step)
    raise ValueError('UNAVAILABLE: Error reading "params/manifest.ocdbt": HTTP 503')

  monkeypatch.setattr(mngr, 'restore', unreachable_storage)
  with pytest.raises(errors.CheckpointError, match='step 2 .*storage error.*left in place'):
    ckpt.restore_latest(mngr, _state(0), _Counted())
  assert attempts == [2] * (len(bucket.delays()) + 1)  # retried for the window, never an older step
  assert sorted(runs.checkpoint_steps(tmp_path)) == [1, 2] and not list(
    runs.checkpoint_dir(tmp_path).glob('*.corrupt*')
  )
  monkeypatch.undo()
  ckpt.close(mngr)
