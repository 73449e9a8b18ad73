"""Small configs and synthetic batches for the trainer's tests and benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from neobert_jax.config import train as train_config
from neobert_jax.train.mlm import abstract_batch
from neobert_jax.weights.flat import check_keys_and_shapes, path_key

# The checkout's root (configs/ holds the recipes), for tests and tools that run from a source tree.
REPO_ROOT = Path(__file__).resolve().parents[2]
# `python -c` puts only the working directory on a child's sys.path, so a child's code that imports tests.support
# starts with SUPPORT_ON_PATH (the checkout's root).
SUPPORT_ON_PATH = f'import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n'


def tiny_config(
  vocab_size: int = 30522, hidden: int = 32, layers: int = 1, seq_len: int = 128, batch: int = 8, steps: int = 6
) -> ml_collections.ConfigDict:
  """The tiny CPU recipe (configs/tiny_cpu.py) shrunk to seconds per run: same code paths, real tokenizer-sized
  vocab by default. Built from the package's schema, not the recipe file, so it needs no checkout."""
  cfg = train_config.get_config()
  # The recipe's choices that are not overridden below.
  cfg.mesh.fsdp, cfg.model.dtype, cfg.data.block_docs = -1, 'float32', 512
  cfg.optimizer.peak_lr = 2e-3
  m = cfg.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads = vocab_size, hidden, layers, 2
  m.intermediate_size, m.max_length = 2 * hidden, seq_len
  cfg.data.max_predictions = max(4, seq_len // 4)
  cfg.train.global_batch_size, cfg.train.num_steps = batch, steps
  cfg.optimizer.warmup_steps = 2
  cfg.eval.every_steps, cfg.eval.at_start, cfg.eval.num_batches = 0, False, 2
  cfg.checkpoint.every_steps, cfg.checkpoint.keep = 3, 3
  cfg.logging.log_every, cfg.logging.progress_bar, cfg.logging.tensorboard = 1, False, False
  cfg.logging.peak_flops_per_device = 1e11  # skip the CPU matmul measurement in tests
  return cfg


def synthetic_batch(
  cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, seed: int, accum: int | None = None, as_numpy: bool = False
) -> dict:
  """A random packed MLM batch [A, M, ...] matching abstract_batch, with a varying number of real slots per row."""
  rng = np.random.default_rng(seed)
  shapes = abstract_batch(cfg, mesh, accum)
  out = {}
  for k, s in shapes.items():
    a, m, n = s.shape
    if k == 'input_ids':
      v = rng.integers(1, cfg.model.vocab_size, s.shape)
    elif k == 'positions':
      v = np.broadcast_to(np.arange(n) % (n // 2), s.shape)  # two documents per row
    elif k == 'segment_ids':
      v = np.broadcast_to(1 + (np.arange(n) >= n // 2), s.shape)
    elif k == 'mlm_positions':
      v = rng.integers(0, cfg.model.max_length, s.shape)
    elif k == 'mlm_labels':
      v = rng.integers(1, cfg.model.vocab_size, s.shape)
    elif k == 'mlm_weights':
      v = (rng.random(s.shape) < rng.uniform(0.3, 1.0, (a, m, 1))).astype(np.float32)
    else:  # dense labels
      v = np.where(rng.random(s.shape) < 0.2, rng.integers(1, cfg.model.vocab_size, s.shape), -100)
    v = np.ascontiguousarray(v.astype(s.dtype))
    out[k] = v if as_numpy else jax.device_put(v, s.sharding)
  return out


def mlm_rows(cfg: ml_collections.ConfigDict, seed: int = 0, fraction: float = 0.2) -> dict[str, np.ndarray]:
  """One global batch of full rows (one document each, no padding) with `fraction` of the tokens carrying the loss,
  every key of data/pipeline/batch.py filled consistently: the sparse slots and the dense labels name the same tokens, so
  a sparse-head step, a dense-head step and the PyTorch model see the same work. Shapes [B, ...], no accum axis."""
  rng = np.random.default_rng(seed)
  b, t, p = cfg.train.global_batch_size, cfg.model.max_length, max(cfg.data.max_predictions, 1)
  ids = rng.integers(1000, cfg.model.vocab_size, (b, t)).astype(np.int32)
  chosen = rng.random((b, t)) < fraction
  chosen &= np.cumsum(chosen, 1) <= p  # no more loss tokens than sparse slots
  pos = np.zeros((b, p), np.int32)
  weights = np.zeros((b, p), np.float32)
  for r in range(b):
    idx = np.flatnonzero(chosen[r])
    pos[r, : len(idx)], weights[r, : len(idx)] = idx, 1.0
  return {
    'input_ids': np.where(chosen, 103, ids).astype(np.int32),  # 103: [MASK] of the BERT vocabulary
    'positions': np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
    'segment_ids': np.ones((b, t), np.int32),
    'labels': np.where(chosen, ids, -100).astype(np.int32),
    'mlm_positions': pos,
    'mlm_labels': np.take_along_axis(ids, pos, 1),
    'mlm_weights': weights,
  }


def assert_identical_params(a: dict, b: dict) -> None:
  """Two {dotted key: array} parameter sets are bit-identical (the tests' exact-resume check)."""
  assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def files_of(workdir: Path) -> dict[str, bytes]:
  """Every file's path and bytes under `workdir`: what 'nothing was touched' means."""
  return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob('*')) if p.is_file()}


def assert_resumes_identically(run: Path, copy: Path, last_kept: int, cfg: ml_collections.ConfigDict) -> None:
  """A copy of the finished `run` whose checkpoints after step `last_kept` are gone (as if killed then), trained on
  with `cfg`, ends with the run's parameters (and moving average, if any) bit for bit."""
  import shutil

  from neobert_jax.weights import runs

  shutil.copytree(run, copy)
  for step in runs.checkpoint_steps(copy):
    if step > last_kept:
      shutil.rmtree(runs.step_dir(copy, step))
  assert runs.latest_step(copy) == last_kept
  assert train_only(cfg, copy).final_step == cfg.train.num_steps
  items = (runs.PARAMS_ITEM, runs.EMA_ITEM) if cfg.train.ema_decay > 0 else (runs.PARAMS_ITEM,)
  for item in items:
    assert_identical_params(runs.restore_params(copy, None, item)[1], runs.restore_params(run, None, item)[1])


def tiny_run_command(workdir: str, data_dir: str, steps: int = 6) -> list[str]:
  """The command line that trains the tiny run (tiny_config) on data_dir into workdir in a process of its own, as
  the bucket-fault tests and the outage benchmark start it: warnings and the one-line error on stderr. (A -c line,
  not a module run as __main__: it is not a user's command.)"""
  import sys

  code = SUPPORT_ON_PATH + 'from tests.support import tiny_train; tiny_train.run_tiny(*sys.argv[1:])'
  return [sys.executable, '-c', code, workdir, data_dir, str(steps)]


def train_only(cfg: ml_collections.ConfigDict, workdir: str | Path, on_step: Any = None) -> Any:
  """Trains as the train command's job does (the workdir's lease, then train/pretraining.train) without its export
  and report: what most training tests need. Returns pretraining's RunResult."""
  from neobert_jax import paths
  from neobert_jax.engine import session
  from neobert_jax.train import pretraining

  workdir = paths.resolve(workdir, '--workdir')
  with session.claim(workdir, cfg.run_id) as lease:
    return pretraining.train(cfg, workdir, lease, on_step)


def finished_tiny_run(workdir: str | Path, steps: int = 6) -> int:
  """train_only(tiny_config(steps=steps)) finished in workdir; returns its newest checkpoint's step. Under the test
  suite (tests/conftest.py's NEOBERT_TESTS_SHARED_RUNS) the run is trained once for the session, by whichever worker
  asks first while the other waits on a lock, and copied: the files that start from it share one run instead of
  training the same deterministic run each."""
  import fcntl
  import os
  import shutil

  from neobert_jax.weights import runs

  shared = os.environ.get('NEOBERT_TESTS_SHARED_RUNS')
  if not shared:
    train_only(tiny_config(steps=steps), workdir)
    return runs.latest_step(workdir)
  os.makedirs(shared, exist_ok=True)
  done = Path(shared) / f'tiny-{steps}'
  with open(Path(shared) / f'tiny-{steps}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.is_dir():
      staging = Path(shared) / f'tiny-{steps}.partial'
      shutil.rmtree(staging, ignore_errors=True)
      train_only(tiny_config(steps=steps), staging)
      staging.rename(done)
  shutil.copytree(done, workdir, dirs_exist_ok=True)
  return runs.latest_step(workdir)


def run_tiny(workdir: str, data_dir: str, steps: str) -> None:
  """tiny_run_command's body: the tiny run on data_dir, its errors reported as one line (errors.reported)."""
  import logging

  from neobert_jax import errors

  logging.basicConfig(level=logging.WARNING, format='%(name)s: %(message)s')
  cfg = tiny_config(steps=int(steps))
  cfg.data.dir = data_dir
  with errors.reported('train'):
    train_only(cfg, workdir)


def kill_when_paused(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
  """Starts `argv` (a test's child: it prints the line PAUSED where it must die, then waits), sends it SIGKILL once
  it has printed PAUSED and reaps it; returns its pid. Fails with its output when it ends without pausing."""
  import signal
  import subprocess

  child = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  try:
    lines = []
    for line in child.stdout:
      lines.append(line)
      if line.strip() == 'PAUSED':
        break
    assert lines and lines[-1].strip() == 'PAUSED', ''.join(lines)[-3000:]
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
  assert child.returncode == -signal.SIGKILL
  return child.pid


def model_from_flat(make_model: Callable[[], nnx.Module], flat: Mapping[str, np.ndarray]) -> nnx.Module:
  """A model holding `flat` on the default device (no mesh), in the model's dtypes. Every key and shape is checked
  first (ValueError)."""
  graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
  model = nnx.merge(graphdef, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract))
  variables = {path_key(path): var for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  check_keys_and_shapes(
    flat,
    {k: tuple(v[...].shape) for k, v in variables.items()},
    'the parameters',
    'check that the model config (layers, sizes, vocab) matches the checkpoint',
    error=ValueError,
  )
  for key, var in variables.items():
    current = var[...]
    var[...] = jax.device_put(np.asarray(flat[key]).astype(current.dtype), current.sharding)
  return model


def run_history(workdir) -> list[dict[str, Any]]:
  """A run's recorded starts and resumes (train/resume.HISTORY_FILE, local or on a bucket), oldest first."""
  import json

  from neobert_jax import paths
  from neobert_jax.train import resume

  lines = (paths.resolved(workdir) / resume.HISTORY_FILE).read_text(encoding='utf-8').splitlines()
  return [json.loads(line) for line in lines if line.strip()]
