"""The Ray engine's work area (OUTPUT/.prepare-work): what a build has finished, seen by every node and a re-run.

build.json (the build's identity), units/NNNNNN.SPLIT.npz (records), units/NNNNNN.done.npz (counts, written
last: the unit's entry), shards/NAME.json (a shard in place, with its plan). Every object is written whole.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import shutil

import numpy as np

from neobert_jax import errors, paths
from neobert_jax.data.prepare import sources

WORK = '.prepare-work'
_PARALLEL = 16  # object-store reads of a resumed build's entries at once (each is a small request)


def _npz(arrays: dict) -> bytes:
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


class Ledger:
  """Sent to every task: just where the area is."""

  def __init__(self, output: paths.Path | str):
    self.root = f'{os.fspath(output).rstrip("/")}/{WORK}'

  def _path(self, *parts: str) -> paths.Path:
    return paths.Path('/'.join((self.root,) + parts))

  def _put(self, rel: str, data: bytes) -> None:
    path = self._path(rel)
    if paths.is_url(self.root):
      path.write_bytes(data)  # an object appears whole
      return
    tmp = f'{os.fspath(path)}.tmp-{os.getpid()}'
    with open(tmp, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)

  def start(self, identity: dict) -> bool:
    """Opens the area for a build; True when it resumes an earlier run of the same build."""
    marker = self._path('build.json')
    if marker.exists():
      if json.loads(marker.read_text()) == identity:
        return True
      print(f'prepare: {self.root} holds an unfinished build of other inputs or flags; starting afresh')
      self.remove()
    for sub in ('units', 'shards'):
      self._path(sub).mkdir(parents=True, exist_ok=True)
    self._put('build.json', json.dumps(identity, sort_keys=True).encode())
    return False

  def check_visible(self) -> None:
    """In a task: this node sees the area (a local --output must be a directory every node mounts)."""
    if not self._path('build.json').exists():
      raise errors.StorageError(
        f'{self.root} cannot be seen from this node: on a cluster, --output must be a bucket (gs://...) or a '
        'directory every node mounts at the same path'
      )

  def write_unit(
    self, index: int, records: dict[str, dict[str, np.ndarray]], counts: dict, doc_tokens: dict[str, np.ndarray]
  ) -> None:
    for split, arrays in records.items():
      self._put(f'units/{index:06d}.{split}.npz', _npz(arrays))
    meta = np.frombuffer(json.dumps(counts, sort_keys=True).encode(), np.uint8)
    self._put(f'units/{index:06d}.done.npz', _npz({'meta': meta, **doc_tokens}))

  def read_records(self, index: int, split: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(self._path(f'units/{index:06d}.{split}.npz').read_bytes())) as z:
      return {k: z[k] for k in z.files}

  def finished_units(self) -> dict[int, tuple[dict, dict[str, np.ndarray]]]:
    """index -> (counts, per-document token counts per split) of every unit with an entry."""

    def read(path):
      with np.load(io.BytesIO(path.read_bytes())) as z:
        doc_tokens = {k: z[k] for k in z.files if k != 'meta'}
        return int(path.name.split('.')[0]), (json.loads(z['meta'].tobytes()), doc_tokens)

    done = self._entries('units', '.done.npz')
    with concurrent.futures.ThreadPoolExecutor(_PARALLEL) as pool:
      return dict(pool.map(read, done))

  def _entries(self, sub: str, suffix: str) -> list[paths.Path]:
    folder = self._path(sub)  # on a bucket a folder exists only while it holds an object
    return [p for p in folder.iterdir() if p.name.endswith(suffix)] if folder.exists() else []

  def write_shard(self, name: str, entry: dict) -> None:
    self._put(f'shards/{name}.json', json.dumps(entry, sort_keys=True).encode())

  def finished_shards(self) -> dict[str, dict]:
    found = self._entries('shards', '.json')
    with concurrent.futures.ThreadPoolExecutor(_PARALLEL) as pool:
      return dict(pool.map(lambda p: (p.name[: -len('.json')], json.loads(p.read_text())), found))

  def remove(self) -> None:
    root = self._path()
    if not paths.is_url(self.root):
      shutil.rmtree(root, ignore_errors=True)
      return
    if not root.exists():
      return
    objects = list(sources.walk(root))
    with concurrent.futures.ThreadPoolExecutor(_PARALLEL) as pool:
      list(pool.map(lambda p: p.unlink(missing_ok=True), objects))
