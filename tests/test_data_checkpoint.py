"""The iterator state inside an Orbax checkpoint, and multi-process prefetch."""

import numpy as np
import pytest

from neobert_jax.config import data as config_lib
from support import synthetic_data
from neobert_jax.data.pipeline import iterators as pipeline


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp('prepared'))
  synthetic_data.write_prepared(d, synthetic_data.synthetic_documents(400, max_len=200), max_length=256)
  return d


def _cfg(data_dir, **kw):
  cfg = config_lib.default_data_config()
  cfg.dir = data_dir
  cfg.block_docs = 50
  cfg.max_predictions = 32
  cfg.update(kw)
  return cfg


def _same(a, b):
  return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def test_orbax_checkpoint_round_trip(data_dir, tmp_path):
  ocp = pytest.importorskip('orbax.checkpoint')
  import grain  # pylint: disable=g-import-not-at-top

  cfg = _cfg(data_dir)
  it = pipeline.make_train_iterator(cfg, 4, 256, seed=1)
  for _ in range(7):
    next(it)
  mngr = ocp.CheckpointManager(str(tmp_path / 'ckpt'))
  mngr.save(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
  mngr.wait_until_finished()
  want = [next(it) for _ in range(5)]
  fresh = pipeline.make_train_iterator(cfg, 4, 256, seed=1)
  mngr.restore(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  assert _same([next(fresh) for _ in range(5)], want)
  mngr.close()


def test_multiprocess_prefetch_resumes_exactly(data_dir):
  # Spawning workers costs seconds each, so one run + one resumed run.
  cfg = _cfg(data_dir, num_workers=2)
  it = pipeline.make_train_iterator(cfg, 4, 256, seed=0)
  try:
    first = [next(it) for _ in range(6)]
    state = it.get_state()
    tail = [next(it) for _ in range(4)]
  finally:
    it.close()
  resumed = pipeline.make_train_iterator(cfg, 4, 256, seed=0)
  try:
    resumed.set_state(state)
    assert _same([next(resumed) for _ in range(4)], tail)
  finally:
    resumed.close()
  # Workers build different blocks: the batches are not one worker's repeated.
  assert not np.array_equal(first[0]['input_ids'], first[1]['input_ids'])
