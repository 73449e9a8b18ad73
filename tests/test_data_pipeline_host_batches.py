"""One host's batches and their position (neobert_jax/data/pipeline/host_batches.py): a state that survives JSON
resumes exactly mid-block and across epochs, and the processes of a job split one global stream row for row
(tests/test_data_elastic.py: the same holds across a change of process count)."""

import json

import numpy as np
import pytest
from tests.support import pipeline_data

from neobert_jax.data import pipeline

from tests.support import synthetic_data


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return pipeline_data.write_corpus(tmp_path_factory)


@pytest.mark.parametrize('packing', ['packed', 'none'])
def test_exact_resume_mid_block_and_across_epochs(data_dir, packing):
  cfg = pipeline_data.data_cfg(data_dir, packing=packing, max_predictions=16)
  ref = pipeline.make_train_iterator(cfg, 8, 128, seed=0)
  states, batches = [], []
  for _ in range(90):  # > 2 epochs with the 'packed' rows
    states.append(ref.get_state())
    batches.append(next(ref))
  for i in (0, 5, 37, 61):
    it = pipeline.make_train_iterator(cfg, 8, 128, seed=0)
    it.set_state(json.loads(json.dumps(states[i])))  # must survive a JSON round trip
    assert pipeline_data.same(pipeline_data.take(it, 3), batches[i : i + 3]), i


def test_processes_split_one_global_stream(data_dir):
  # Process p of 3 owns rows [10p, 10p + 10) of every global batch of 30: disjoint, and together exactly the
  # single-process stream (tests/test_data_elastic.py: the same holds across a change of process count).
  cfg = pipeline_data.data_cfg(data_dir, packing='none')
  whole = pipeline.make_train_iterator(cfg, 30, 128, seed=0)
  parts = [pipeline.make_train_iterator(cfg, 10, 128, seed=0, process_index=p, process_count=3) for p in range(3)]
  seen = []
  for _ in range(80):  # two epochs of 600 docs (blocks straddle the epoch end)
    batch, mine = next(whole), [next(it) for it in parts]
    for k in batch:
      assert np.array_equal(batch[k], np.concatenate([m[k] for m in mine]))
    seen.append([set(synthetic_data.documents_in(m)) for m in mine])
  assert set.union(*[d for docs in seen for d in docs]) == set(range(pipeline_data.N_DOCS))
