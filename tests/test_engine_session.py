"""The engine's training session (neobert_jax/engine/session.py): where a run's state starts (restore_or_init),
the default checkpoint hook and the final save, what it writes and when, and its closing, on the tiny MLM model,
one device.

The tasks' own runs (train/pretraining.py, jobs/finetune.py) are tested end to end by the train and downstream tests;
these check the engine's part on its own.
"""

from __future__ import annotations

import contextlib
import itertools
import json

import jax
import numpy as np
import pytest
from flax import nnx

from neobert_jax import errors
from neobert_jax import sharding as shd
from neobert_jax.config import train as train_config
from neobert_jax.engine import session as session_lib
from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.engine.state import param_count
from neobert_jax.train import mlm
from tests.support.tiny_train import synthetic_batch, tiny_config
from neobert_jax.weights import runs
from neobert_jax.weights import source as source_lib
from neobert_jax.weights.flat import path_key


@pytest.fixture(scope='module')
def setup():
  cfg = tiny_config(vocab_size=128, hidden=16, seq_len=32, batch=2, steps=3)
  cfg.mesh.fsdp = 1
  cfg, _ = train_config.resolve_train(
    train_config.validate_train(cfg, num_devices=1), num_devices=1
  )  # as the training paths do
  mesh = shd.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1}, devices=jax.devices()[:1])
  return cfg, mesh


def _makers(cfg, mesh):
  return lambda: mlm.abstract_train_state(cfg, mesh), lambda: mlm.create_train_state(cfg, mesh)


def _flat(params) -> dict[str, np.ndarray]:
  return {path_key(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))[0]}


def _session(workdir, cfg, **kwargs):
  return session_lib.TrainingSession(workdir, cfg, keep=5, async_save=False, **kwargs)  # no TensorBoard, no bar


@pytest.mark.slow
def test_restore_or_init_takes_the_checkpoint_then_the_source_then_fresh_parameters(setup, tmp_path):
  cfg, mesh = setup
  abstract, create = _makers(cfg, mesh)
  with _session(tmp_path / 'a', cfg) as run:
    start = run.restore_or_init(abstract, create)
    assert (start.step, start.resumed, start.origin) == (0, False, 'fresh parameters')
    fresh = _flat(start.state['params'])
    run.save(4, start.state)
  # The same workdir again: the checkpoint, whatever the init source says.
  opened = []
  with _session(tmp_path / 'a', cfg) as run:
    start = run.restore_or_init(abstract, create, source=lambda: opened.append(1))
    assert (start.step, start.resumed) == (4, True) and start.origin.endswith('checkpoints/4')
  assert not opened  # a resumed run never opens its init source
  for k, v in fresh.items():
    np.testing.assert_array_equal(_flat(start.state['params'])[k], v, err_msg=k)
  # A new workdir with that run as its init source: its parameters under a fresh optimizer, at step 0.
  src = source_lib.from_init(str(tmp_path / 'a'), '', -1)
  with _session(tmp_path / 'b', cfg) as run:
    start = run.restore_or_init(abstract, create, source=lambda: src)
  assert (start.step, start.resumed) == (0, False) and str(tmp_path / 'a') in start.origin
  assert int(np.asarray(start.state['opt']['step'][...])) == 0
  for k, v in fresh.items():
    np.testing.assert_array_equal(_flat(start.state['params'])[k], v, err_msg=k)
  # resume=False (fine-tuning) ignores a checkpoint in the workdir.
  with _session(tmp_path / 'a', cfg) as run:
    assert run.restore_or_init(abstract, create, resume=False).origin == 'fresh parameters'


@pytest.mark.slow
def test_the_checkpoint_hook_and_the_final_save_write_what_resume_reads(setup, tmp_path):
  cfg, mesh = setup
  abstract, create = _makers(cfg, mesh)
  batches = ((synthetic_batch(cfg, mesh, seed=s), 100) for s in itertools.count())
  with _session(tmp_path, cfg) as run:
    start = run.restore_or_init(abstract, create)
    n = param_count(start.state)
    options = trainer_lib.TrainerOptions(num_steps=5, log_every=1, checkpoint_every=2)
    trained = run.trainer(mlm.jit_mlm_train_step(cfg, mesh, start.defs), start, batches, options).train()
    assert options.hooks == () and trained.final_step == 5 and not trained.preempted  # the options stay as given
    run.save_final(trained)
  # Steps 2 and 4 by the hook (and 5, the last step, by the hook too), nothing saved twice.
  assert runs.latest_step(tmp_path) == 5
  assert sorted(int(p.name) for p in (tmp_path / 'checkpoints').iterdir()) == [2, 4, 5]
  lines = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in lines] == [1, 2, 3, 4, 5] and all(np.isfinite(r['train/loss']) for r in lines)
  assert runs.read_config(tmp_path).model.hidden_size == cfg.model.hidden_size
  with _session(tmp_path, cfg) as run:
    start = run.restore_or_init(abstract, create)
  assert start.step == 5 and param_count(start.state) == n


def test_params_only_steps_hold_no_optimizer_state(setup, tmp_path):
  # Fine-tuning's best step goes through the same writer, without the optimizer: what weights/runs.py reads.
  cfg, mesh = setup
  abstract, create = _makers(cfg, mesh)
  with _session(tmp_path, cfg) as run:
    start = run.restore_or_init(abstract, create)
    run.save_params(7, start.state)
  step_dir = tmp_path / 'checkpoints' / '7'
  assert (step_dir / 'params').is_dir() and (step_dir / runs.CONFIG_ITEM).is_dir()
  assert not (step_dir / 'opt').exists()
  assert runs.latest_step(tmp_path) == 7
  model_cfg, flat = runs.restore_params(tmp_path)
  assert model_cfg.hidden_size == cfg.model.hidden_size
  for k, v in _flat(start.state['params']).items():
    np.testing.assert_array_equal(flat[k], v, err_msg=k)


def test_the_run_closes_what_it_opened_in_reverse_order_even_on_an_error(setup, tmp_path):
  cfg, _ = setup
  order = []

  @contextlib.contextmanager
  def held(name):
    order.append(f'enter {name}')
    try:
      yield name
    finally:
      order.append(f'exit {name}')

  with pytest.raises(RuntimeError, match='boom'):
    with _session(tmp_path, cfg) as run:
      assert run.hold(held('lease')) == 'lease'
      run.on_close(order.append, 'close iterator')
      raise RuntimeError('boom')
  assert order == ['enter lease', 'close iterator', 'exit lease']
  # Nothing was written but the checkpoint directory: metrics and TensorBoard open on first use.
  assert sorted(p.name for p in tmp_path.iterdir()) == ['checkpoints']


def test_check_workdir_refuses_a_file_with_one_line(tmp_path):
  (tmp_path / 'afile').write_text('x')
  with pytest.raises(errors.ConfigError, match='is a file, not a directory'):
    session_lib.check_workdir(tmp_path / 'afile')
  session_lib.check_workdir(tmp_path / 'new')  # a missing directory is fine: it is created when written


def test_a_metrics_write_that_fails_is_one_storage_line_naming_what_is_kept(tmp_path):
  """A full disk can hit a metrics line before the checkpoint save notices: the same one-line StorageError."""
  from neobert_jax.engine import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

  def failed(e):
    return errors.StorageError(f'writing the metrics failed ({errors.one_line(e)}); checkpoint 4 is kept')

  writer = metrics_lib.MetricsWriter(tmp_path, tensorboard=False, on_storage_error=failed)

  class FullDisk:
    def write(self, text):
      raise OSError(28, 'No space left on device')

    def close(self):
      pass

  writer._jsonl = FullDisk()  # the open file, as a full disk answers it
  with pytest.raises(errors.StorageError, match='No space left on device.*checkpoint 4 is kept'):
    writer.write(5, {'loss': 1.0})
  writer.close()
