"""The planner's compiles, run in spawned processes where cores allow and cached on disk (paths.cache_dir('plan'))
under the resolved config, the target, what was compiled and a fingerprint of the package's source and jax's
version: a re-run compiles only what changed."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any, Callable

from neobert_jax import paths


@functools.cache
def source_fingerprint() -> str:
  """The package's Python source and jax's version: anything that changes the compiled program."""
  import jax  # pylint: disable=g-import-not-at-top

  h = hashlib.sha256(jax.__version__.encode())
  root = Path(__file__).resolve().parents[1]
  for f in sorted(root.rglob('*.py')):
    h.update(str(f.relative_to(root)).encode())
    h.update(f.read_bytes())
  return h.hexdigest()[:16]


def key(cfg, target, what: tuple) -> str:
  text = json.dumps([cfg.to_json_best_effort(sort_keys=True), target.spec, list(what), source_fingerprint()])
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached(cfg, target, what: tuple, compute: Callable[[], Any]) -> tuple[Any, bool]:
  """(compute()'s JSON-able result, whether it came from the cache)."""
  path = paths.cache_dir('plan') / f'{key(cfg, target, what)}.json'
  if path.exists():
    try:
      return json.loads(path.read_text())['result'], True
    except (ValueError, KeyError):
      pass  # a damaged entry is computed again
  result = compute()
  tmp = path.with_suffix(f'.tmp-{os.getpid()}')
  tmp.write_text(json.dumps({'target': target.spec, 'what': list(what), 'result': result}))
  os.replace(tmp, path)  # all or nothing: parallel planners may write the same entry
  return result, False


def default_workers() -> int:
  """One search per two cores: XLA's compiler uses more than one thread, and each process holds a backend."""
  return max(1, (os.cpu_count() or 1) // 2)


def pool_map(
  fn: Callable[[Any], Any], items: list, workers: int, initializer: Callable[..., None], initargs: tuple
) -> list:
  """fn over items in `workers` spawned processes (a forked jax runtime is not safe to use), in order."""
  ctx = multiprocessing.get_context('spawn')
  with concurrent.futures.ProcessPoolExecutor(
    min(workers, len(items)), mp_context=ctx, initializer=initializer, initargs=initargs
  ) as pool:
    return list(pool.map(fn, items))
