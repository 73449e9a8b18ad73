"""Elastic resume: the data position is a table of virtual-shard positions (data.virtual_shards, here 8: automatic for a
global batch of 8), so 1 -> 2 -> 4 -> 2 processes continue the uninterrupted run's rows, a process count that does not
divide it is refused in one line, and a seek to step 1,000,000 costs what a seek to step 10 does (a checkpoint's
position, restored under another process count: tests/test_data_pipeline_position.py). Also: a killed `prepare`
leaves no litter behind."""

import json
import os
import subprocess
import sys
import time

import pytest
from tests.support import pipeline_data

from neobert_jax.config import data as config_lib
from tests.support import synthetic_data
from neobert_jax.data import pipeline
from neobert_jax.data.prepare import local as prepare_lib

GLOBAL_BATCH = 8


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp('prepared'))
  synthetic_data.write_prepared(d, synthetic_data.synthetic_documents(300, max_len=200), max_length=128)
  return d


def _cfg(data_dir):
  cfg = config_lib.default_data_config()
  cfg.dir, cfg.block_docs, cfg.max_predictions = data_dir, 40, 16
  return cfg


def _iters(cfg, n, state=None):
  """The n per-process train iterators of an n-process job, optionally restored to `state`."""
  its = [
    pipeline.make_train_iterator(cfg, GLOBAL_BATCH // n, 128, seed=0, process_index=p, process_count=n)
    for p in range(n)
  ]
  for it in its:
    if state is not None:
      it.set_state(json.loads(json.dumps(state)))  # as a checkpoint stores it
  return its


def test_one_two_four_processes_continue_the_uninterrupted_rows(data_dir):
  cfg = _cfg(data_dir)
  reference = pipeline_data.global_batches(_iters(cfg, 1), 14)  # > 1 epoch of 300 docs at 8 rows x 128
  run = _iters(cfg, 1)
  got = pipeline_data.global_batches(run, 4)
  state = run[0].get_state()
  two = _iters(cfg, 2, state)
  got += pipeline_data.global_batches(two, 4)
  states = [it.get_state() for it in two]
  # each process holds the positions of its own virtual shards only: 0-3 and 4-7
  assert [sorted(next(iter(s['sources'].values()))['shards'], key=int) for s in states] == [
    ['0', '1', '2', '3'],
    ['4', '5', '6', '7'],
  ]
  four = _iters(cfg, 4, pipeline.merge_states(states))
  got += pipeline_data.global_batches(four, 4)
  back = _iters(cfg, 2, pipeline.merge_states([it.get_state() for it in four]))
  got += pipeline_data.global_batches(back, 2)
  assert pipeline_data.same(got, reference[: len(got)])
  # the rows of a step are split, never shared, between processes
  docs = [
    set(synthetic_data.documents_in({k: v[p * 2 : (p + 1) * 2] for k, v in reference[-1].items()})) for p in range(4)
  ]
  assert sum(map(len, docs)) == len(set.union(*docs))


def test_seek_to_step_one_million_takes_milliseconds_not_a_replay(data_dir):
  cfg = _cfg(data_dir)
  # The position a 1M-step run holds: a block deep in its ~27k-th epoch, mid-block.
  far = pipeline.state_at(block=1_000_000, row=3, shards_=range(8))
  t0 = time.perf_counter()
  one = pipeline_data.global_batches(_iters(cfg, 1, far), 3)
  seconds = time.perf_counter() - t0
  assert seconds < 10, seconds  # one block built per iterator; a replay would build 1M
  assert pipeline_data.same(pipeline_data.global_batches(_iters(cfg, 2, far), 3), one)
  assert pipeline_data.same(pipeline_data.global_batches(_iters(cfg, 4, far), 3), one)
  # and it is a different place in the stream than the start
  assert not pipeline_data.same(one, pipeline_data.global_batches(_iters(cfg, 1), 3))


def test_a_process_count_that_does_not_divide_the_virtual_shards_is_one_line(data_dir):
  from neobert_jax import errors  # pylint: disable=g-import-not-at-top

  cfg = _cfg(data_dir)
  cfg.virtual_shards = 4
  with pytest.raises(errors.ConfigError, match=r'virtual_shards=4 is not a multiple of the process count 3.*divides'):
    pipeline.make_train_iterator(cfg, 4, 128, seed=0, process_index=0, process_count=3)
  with pytest.raises(errors.ConfigError, match=r'global batch \(6 rows\) is not a multiple of data.virtual_shards=4'):
    pipeline.make_train_iterator(cfg, 6, 128, seed=0)


def test_a_global_batch_mixes_every_virtual_shard(data_dir):
  # What a global batch mixes: B/V rows from each of the V virtual shards, each a contiguous 1/V of the corpus.
  cfg = _cfg(data_dir)
  cfg.packing = 'none'  # one document per row, so a row names its document
  batch = next(_iters(cfg, 1)[0])
  per_row = [synthetic_data.documents_in({k: v[r : r + 1] for k, v in batch.items()}) for r in range(GLOBAL_BATCH)]
  # Synthetic documents are numbered in corpus order (a continuation record of a long document names none): row r
  # comes from virtual shard r, the r-th eighth of the corpus, so the numbers rise row by row and span the corpus.
  named = [d[0] for d in per_row if d and d[0] < 300]
  assert len(named) >= 5 and named == sorted(named) and named[-1] - named[0] > 150, named


def test_next_prepare_removes_a_killed_prepares_temp_dir(tmp_path):
  vocab = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), ['alpha', 'beta', 'gamma'])
  (tmp_path / 'in.txt').write_text('alpha beta gamma\n' * 2000)
  out = tmp_path / 'out'
  # A prepare killed mid-write (SIGKILL skips its `finally`), as a user's Ctrl-\ or the OOM killer would.
  child = subprocess.Popen(
    [
      sys.executable,
      '-c',
      'import os, sys, time\n'
      'from neobert_jax.data import shards\nfrom neobert_jax.data.prepare import local as prepare\n'
      'real = shards.ShardWriter.write_document\n'
      'def write(self, chunks):\n'
      '  real(self, chunks); print("writing", flush=True); time.sleep(60)\n'
      'shards.ShardWriter.write_document = write\n'
      f'prepare.prepare_local([{str(tmp_path / "in.txt")!r}], {str(out)!r}, tokenizer={vocab!r})\n',
    ],
    stdout=subprocess.PIPE,
    text=True,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  )
  assert child.stdout.readline().strip() == 'writing'
  child.kill()
  child.wait()
  left = sorted(p.name for p in out.iterdir())
  # and its lease, which the next prepare takes at once: its holder's process on this host is gone
  assert left == [f'.prepare-tmp-{child.pid}', 'lease.json'], left
  # a live process's temp dir (another prepare at work) is left alone
  (out / f'.prepare-tmp-{os.getppid()}').mkdir()
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'neobert_jax.data.prepare',
      '--input',
      str(tmp_path / 'in.txt'),
      '--output',
      str(out),
      '--tokenizer',
      vocab,
      '--workers',
      '0',
      '--no-progress',
    ],
    capture_output=True,
    text=True,
    check=True,
    env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  )
  assert f'removed {out / f".prepare-tmp-{child.pid}"}' in result.stderr
  assert 'interrupted prepare' in result.stderr and 'left alone' in result.stderr
  assert sorted(p.name for p in out.iterdir() if p.name.startswith('.prepare-tmp')) == [f'.prepare-tmp-{os.getppid()}']
  assert (out / 'manifest.json').is_file()
  assert prepare_lib.remove_stale_tmp(str(out)) == []  # nothing stale remains
