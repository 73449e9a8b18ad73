"""The batch-size warmup: the sizes and where they start, exact token counts, throughput without the recompiles, and
a run killed with kill -9 mid-ramp that the same command finishes bit-identical to the uninterrupted one.

This file is also the killed process: `python tests/test_train_ramp.py child WORKDIR`."""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from neobert_jax.config import ramp
from tests.support.tiny_train import tiny_config

REPO = Path(__file__).resolve().parents[1]
SEQ = 128
# From 16 sequences (2 per test device) to 32 over 6144 tokens: 16 for 3 steps, then 32: one recompile.
START, GLOBAL, TOKENS, STEPS, PAUSE_AFTER = 16, 32, 6144, 5, 3


def _cfg():
  cfg = tiny_config(seq_len=SEQ, batch=GLOBAL, steps=STEPS)
  cfg.train.batch_warmup_tokens, cfg.train.batch_warmup_start = TOKENS, START
  cfg.checkpoint.every_steps, cfg.checkpoint.async_save = 2, False  # step 2 (mid-ramp) is on disk when killed
  return cfg


def test_sizes_double_from_the_start_and_follow_the_token_line_from_below():
  cfg = _cfg()
  cfg.train.batch_warmup_start = 8
  table = ramp.phases(cfg)  # 16 once 6144 x (16 - 8) / (32 - 8) = 2048 tokens are seen, 32 from 6144 on
  assert [(p.first_step, p.size, p.tokens_before) for p in table] == [(0, 8, 0), (2, 16, 2048), (4, 32, 6144)]
  assert [ramp.tokens_through(table, SEQ, d) for d in range(7)] == [SEQ * n for n in (0, 8, 16, 32, 48, 80, 112)]
  cfg = tiny_config(batch=4608)
  cfg.train.batch_warmup_start, cfg.train.batch_warmup_tokens = 768, 50 * 10**9  # ModernBERT's 768 -> 4608
  assert ramp.sizes(cfg) == [768, 1536, 3072, 4608]  # three recompiles
  assert ramp.read_rows(cfg) == 768 and ramp.read_rows(tiny_config(batch=32)) == 32


class _Compiles(logging.Handler):
  """jax's 'Compiling jit(NAME) with ...' lines (jax.log_compiles), counted by NAME, and the threads of jit(step)'s."""

  def __init__(self):
    super().__init__()
    self.names = collections.Counter()
    self.step_threads = []

  def emit(self, record):
    message = record.getMessage()
    if message.startswith('Compiling '):
      name = message.split(' with ')[0].removeprefix('Compiling ')
      self.names[name] += 1
      if name == 'jit(step)':
        self.step_threads.append(record.threadName)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  import jax

  from tests.support.tiny_train import train_only

  workdir = tmp_path_factory.mktemp('ramp')
  compiles, jax_log = _Compiles(), logging.getLogger('jax')
  jax_log.addHandler(compiles)
  # Globally, not jax.log_compiles (a thread-local context): the first step compiles on the trainer's thread.
  jax.config.update('jax_log_compiles', True)
  try:
    assert train_only(_cfg(), workdir).final_step == STEPS
  finally:
    jax.config.update('jax_log_compiles', False)
    jax_log.removeHandler(compiles)
  (workdir / 'compiles.json').write_text(json.dumps({**compiles.names, 'step_threads': compiles.step_threads}))
  return workdir


@pytest.mark.slow
def test_logged_sizes_tokens_and_throughput(uninterrupted):
  rows = [json.loads(line) for line in (uninterrupted / 'metrics.jsonl').read_text().splitlines()]
  train = {r['step']: r for r in rows if 'train/loss' in r}
  assert [train[s]['train/batch_size'] for s in range(1, 6)] == [16, 16, 16, 32, 32]
  assert [train[s]['train/tokens_seen'] for s in range(1, 6)] == [SEQ * n for n in (16, 32, 48, 80, 112)]
  # The train step (engine/step.py's jit(step)) compiled once per size: one recompile for 16 -> 32. The first
  # size's compile ran ahead, on engine/trainer.compile_ahead's thread, and the first step found it.
  compiles = json.loads((uninterrupted / 'compiles.json').read_text())
  assert compiles['jit(step)'] == len(ramp.sizes(_cfg())) == 2
  assert compiles['step_threads'] == ['compile-ahead', 'MainThread'], compiles['step_threads']
  # The steps that compiled (the first, the new size) report no throughput; the others do.
  timed = [s for s in train if 'train/tokens_per_sec' in train[s]]
  assert timed == [2, 3, 5] and all(train[s]['train/tokens_per_sec'] > 0 and 'train/mfu' in train[s] for s in timed)


@pytest.mark.slow
def test_kill_9_mid_ramp_then_the_same_command_is_bit_identical(uninterrupted, tmp_path):
  from tests.support.tiny_train import assert_identical_params, kill_when_paused, train_only
  from neobert_jax.weights import runs

  workdir = tmp_path / 'run'
  kill_when_paused(
    [sys.executable, __file__, 'child', str(workdir)],
    env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED='1'),
    cwd=REPO,
  )
  assert runs.latest_step(workdir) == 2  # mid-ramp; the lost step 3 was the first of 32 sequences
  assert train_only(_cfg(), workdir).final_step == STEPS  # the same command again
  assert_identical_params(runs.restore_params(workdir)[1], runs.restore_params(uninterrupted)[1])


def _child(workdir: str) -> None:
  """Trains the ramp, announces PAUSED after step PAUSE_AFTER and waits to be killed."""
  import time

  from tests.support.tiny_train import train_only

  def pause(done: int) -> None:
    if done == PAUSE_AFTER:
      print('PAUSED', flush=True)
      time.sleep(600)

  train_only(_cfg(), workdir, on_step=pause)


if __name__ == '__main__' and sys.argv[1:2] == ['child']:
  _child(sys.argv[2])
