"""Weighted data mixtures: the mixture file, its checks, and which source each row of a step comes from.

docs/data.md ("Several sources") has the file's format and how rows are drawn: per slot (virtual shard) and step,
by largest remainder with carried credit (the sampler's state), in 1/UNITS of a row. A plain data.dir is a mixture
of one (`Mixture.of_dir`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from typing import Any, Callable, Collection, Iterable

import numpy as np

from neobert_jax import errors, paths
from neobert_jax.data import tokenizer as tokenizer_lib

KEYS = ('dir', 'weight')
STREAM = 'neobert_jax.mixture/v1'  # marks a sampler state
UNITS = 1 << 32  # a step's weights are whole numbers summing to this; credits count rows in these units
_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]*')  # a source name is also a metric path: eval/<name>/loss


@dataclasses.dataclass(frozen=True)
class WeightedSource:
  name: str
  dir: str
  schedule: tuple[tuple[int, float], ...]  # (start step, weight), steps strictly increasing

  def weight_at(self, step: int) -> float:
    return next((w for start, w in reversed(self.schedule) if start <= step), 0.0)


@dataclasses.dataclass(frozen=True)
class Mixture:
  path: str  # the file, for messages; '' for a plain data.dir (of_dir)
  sources: tuple[WeightedSource, ...]  # sorted by name: the order rows are apportioned in, whatever the file's order

  @classmethod
  def of_dir(cls, directory: str) -> Mixture:
    """A plain data.dir as the mixture of one it is: its one source, named after the directory, of weight 1."""
    name = re.sub(r'[^A-Za-z0-9_.-]', '_', os.path.basename(directory.rstrip('/'))).lstrip('_.-') or 'data'
    return cls('', (WeightedSource(name, directory, ((0, 1.0),)),))

  @property
  def plain(self) -> bool:
    """Whether this is a plain data.dir, not a mixture file: a source whose position restores whatever its name."""
    return not self.path

  @property
  def where(self) -> str:
    """What names the data in messages: the mixture file, or data.dir."""
    return self.path or f'data.dir={self.sources[0].dir}'

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(s.name for s in self.sources)

  def record(self) -> str:
    """The sources, their directories and weight schedules as one JSON line (what a run records)."""
    return json.dumps({s.name: {'dir': s.dir, 'weight': [list(p) for p in s.schedule]} for s in self.sources})

  def weights_at(self, step: int) -> dict[str, float]:
    """Each source's share of the rows of `step`, normalised to sum to 1."""
    raw = {s.name: s.weight_at(step) for s in self.sources}
    total = sum(raw.values())
    return {n: w / total for n, w in raw.items()}

  def peak_shares(self) -> dict[str, float]:
    """Each source's largest share of the rows over its schedule: how far ahead its reads may run (factories.py)."""
    starts = sorted({start for s in self.sources for start, _ in s.schedule})
    return {n: max(self.weights_at(t)[n] for t in starts) for n in self.names}

  def block_docs(self, block_docs: int, recorded: str = '', shard_records: dict[str, int] | None = None) -> dict:
    """Documents per block of each source: those `recorded` ('name=docs,...'); the others in proportion to their
    peak shares, the heaviest getting `block_docs` (at least 1 each). With `shard_records` (records per virtual
    shard) all shrink until no first block reads more than FIRST_READ of its virtual shard, since a virtual shard
    reads a whole block at its first row of a source."""
    if self.plain:
      return {self.names[0]: block_docs}
    sizes = parse_block_docs(recorded)
    shares = self.peak_shares()
    top = max(shares.values()) or 1.0
    scale = float(block_docs)  # the heaviest source's block
    for n, records in (shard_records or {}).items():
      if shares[n] > 0:
        scale = min(scale, FIRST_READ * records * top / shares[n])
    return {n: sizes.get(n) or max(1, math.ceil(scale * shares[n] / top)) for n in self.names}

  def units_at(self, step: int) -> list[int]:
    """The normalised weights of `step` as whole numbers summing to UNITS (largest remainder, ties by name)."""
    exact = [w * UNITS for w in self.weights_at(step).values()]
    units = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (units[i] - exact[i], i))
    for i in order[: UNITS - sum(units)]:
      units[i] += 1
    return units


# The most of a source's virtual shard its first block may read (Mixture.block_docs).
FIRST_READ = 0.25


def format_block_docs(sizes: dict[str, int]) -> str:
  """data.mixture_block_docs as recorded: 'name=docs,...' in name order."""
  return ','.join(f'{n}={int(d)}' for n, d in sorted(sizes.items()))


def parse_block_docs(text: str) -> dict[str, int]:
  """data.mixture_block_docs read back; ValueError (naming the field) for anything but 'name=docs,...'."""
  out = {}
  for item in filter(None, (x.strip() for x in text.split(','))):
    name, _, docs = item.partition('=')
    if not name or not docs.isdigit() or int(docs) < 1:
      raise ValueError(f"data.mixture_block_docs={text!r}: expected 'name=documents,...' with documents >= 1")
    out[name.strip()] = int(docs)
  return out


class _Object(list):
  """A JSON object as its (key, value) pairs, so that a key given twice is seen (json.load would keep the last)."""


def read(path: str) -> Mixture:
  """The mixture file at `path` (local or gs://), checked; a ConfigError naming the source and the fix if not."""
  url = paths.resolve(path, 'data.mixture')
  if not url.exists():
    raise errors.ConfigError(f'data.mixture={path}: no such file; write the mixture JSON there (docs/data.md)')
  try:
    raw = json.loads(url.read_text(), object_pairs_hook=_Object)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.ConfigError(f'data.mixture={path}: not valid JSON ({e})') from None
  return parse_mixture(raw, str(url), base=str(url.parent))


def parse_mixture(raw: Any, where: str, base: str = '') -> Mixture:
  """A decoded mixture (objects as _Object pairs, or plain dicts) checked; `where` names it in messages."""
  if not isinstance(raw, (_Object, dict)) or not raw:
    raise errors.ConfigError(
      f'{where}: a mixture is a JSON object of sources, {{"name": {{"dir": ..., "weight": ...}}}}; got '
      f'{json.dumps(raw)[:60]}'
    )
  specs = _unique(raw, lambda n: f'{where}: source name {n!r} is used twice; give each source its own name')
  sources = sorted((_source(name, spec, where, base) for name, spec in specs.items()), key=lambda s: s.name)
  mix = Mixture(where, tuple(sources))
  starts = sorted({0} | {step for s in mix.sources for step, _ in s.schedule})
  for i, step in enumerate(starts):
    if not any(s.weight_at(step) > 0 for s in mix.sources):
      until = f' to step {starts[i + 1] - 1}' if i + 1 < len(starts) else ' on'
      raise errors.ConfigError(
        f'{where}: every weight is 0 from step {step}{until}; give at least one source a positive weight there'
      )
  return mix


def _unique(obj, twice: Callable[[str], str]) -> dict[str, Any]:
  """A decoded object's entries; a key given twice (seen in _Object's pairs) is a ConfigError saying `twice(key)`."""
  out = {}
  for key, value in obj if isinstance(obj, _Object) else obj.items():
    if key in out:
      raise errors.ConfigError(twice(key))
    out[key] = value
  return out


def _source(name: str, spec: Any, where: str, base: str) -> WeightedSource:
  if not _NAME.fullmatch(name):
    raise errors.ConfigError(
      f'{where}: source name {name!r}: use letters, digits, _ . - (it names the eval/<name>/loss metrics)'
    )
  if not isinstance(spec, (_Object, dict)):
    raise errors.ConfigError(f'{where}: source {name!r} must be an object {{"dir": ..., "weight": ...}}')
  fields = _unique(spec, lambda key: f'{where}: source {name!r}: key {key!r} is given twice; keep one')
  unknown = [k for k in fields if k not in KEYS]
  if unknown:
    raise errors.ConfigError(f'{where}: source {name!r}: unknown key {unknown[0]!r}; a source has only {list(KEYS)}')
  missing = [k for k in KEYS if k not in fields]
  if missing:
    raise errors.ConfigError(f'{where}: source {name!r} has no {missing[0]!r}; a source has {list(KEYS)}')
  directory = fields['dir']
  if not isinstance(directory, str) or not directory:
    raise errors.ConfigError(f'{where}: source {name!r}: "dir" must be a prepared directory (local or gs://)')
  if not paths.is_url(directory):
    directory = os.path.expanduser(directory)
    if base and not os.path.isabs(directory):
      directory = f'{base}/{directory}' if paths.is_url(base) else os.path.normpath(os.path.join(base, directory))
  return WeightedSource(name, directory, _schedule(name, fields['weight'], where))


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _schedule(name: str, weight: Any, where: str) -> tuple[tuple[int, float], ...]:
  form = 'a number or a schedule [[start_step, weight], ...]'
  if _number(weight):
    pairs = [[0, weight]]
  elif isinstance(weight, list) and weight:
    pairs = weight
  else:
    raise errors.ConfigError(f'{where}: source {name!r}: weight {json.dumps(weight)} must be {form}')
  out: list[tuple[int, float]] = []
  for pair in pairs:
    ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int) and _number(pair[1])
    if not ok or pair[0] < 0 or isinstance(pair[0], bool):
      raise errors.ConfigError(
        f'{where}: source {name!r}: schedule entry {json.dumps(pair)} must be [start_step >= 0, weight]'
      )
    step, w = pair
    if w < 0:
      raise errors.ConfigError(f'{where}: source {name!r}: weight {w} at step {step} is negative; use 0 or more')
    if out and step <= out[-1][0]:
      raise errors.ConfigError(
        f'{where}: source {name!r}: the schedule is not sorted by step ({out[-1][0]} then {step}); list each '
        'start step once, in increasing order'
      )
    out.append((step, float(w)))
  return tuple(out)


def open_sources(mix: Mixture, open_one: Callable[[str], tuple[str, Any]], seq_len: int) -> dict[str, tuple[str, Any]]:
  """Each source's (dir, manifest) through `open_one` (which checks it against the model), checked to share a
  tokenizer and a record length that fits the model; one ConfigError naming the source if not. A plain data.dir is
  opened as it is, its errors its own."""
  if mix.plain:
    return {mix.names[0]: open_one(mix.sources[0].dir)}
  opened = {}
  for s in mix.sources:
    try:
      opened[s.name] = open_one(s.dir)
    except (errors.DataError, errors.StorageError, FileNotFoundError) as e:
      raise errors.ConfigError(f'{mix.path}: source {s.name!r}: {errors.one_line(e)}') from None
  first, (_, ref) = next(iter(opened.items()))
  for name, (_, manifest) in opened.items():
    ident, want = manifest.tokenizer, ref.tokenizer
    if not tokenizer_lib.same_vocabulary(ident, want):
      raise errors.ConfigError(
        f'{mix.path}: source {name!r} was prepared with tokenizer {ident["spec"]!r} ({ident["kind"]}, '
        f'{ident["vocab_size"]} ids), source {first!r} with {want["spec"]!r} ({want["kind"]}, '
        f'{want["vocab_size"]} ids); prepare every source with one tokenizer'
      )
    length, ref_length = manifest.max_length, ref.max_length
    if length != ref_length:
      raise errors.ConfigError(
        f'{mix.path}: source {name!r} was prepared with --max-length {length}, source {first!r} with '
        f'{ref_length}; prepare every source with one --max-length'
      )
    if length is not None and length > seq_len:
      raise errors.ConfigError(
        f"{mix.path}: source {name!r} was prepared with --max-length {length}, longer than the model's "
        f'max_length {seq_len}; prepare it again with --max-length {seq_len}'
      )
  return opened


def starting_credits(seed: int, slot: int, names: Iterable[str]) -> dict[str, int]:
  """A slot's credits at step 0: a seeded fraction of a row per source, so that slots round in different steps."""
  names = list(names)
  draws = np.random.default_rng([seed, slot, 0x6D6978]).integers(0, UNITS, len(names), dtype=np.int64)
  return {n: int(d) for n, d in zip(names, draws)}


def apportion(rows: int, credits: list[int], units: list[int]) -> tuple[list[int], list[int]]:
  """(rows per source, credits after) for one slot's step: each source is owed its credit plus rows * units; the
  `rows` go to the largest debts (whole rows first, then remainders, ties by source order), none to weight 0."""
  owed = [c + rows * u for c, u in zip(credits, units)]
  active = [i for i, u in enumerate(units) if u > 0]
  counts = [max(0, o // UNITS) if u > 0 else 0 for o, u in zip(owed, units)]
  while sum(counts) < rows:
    i = max(active, key=lambda j: (owed[j] - counts[j] * UNITS, -j))
    counts[i] += 1
  while sum(counts) > rows:
    i = min((j for j in active if counts[j]), key=lambda j: (owed[j] - counts[j] * UNITS, j))
    counts[i] -= 1
  return counts, [o - n * UNITS for o, n in zip(owed, counts)]


def interleave(counts: list[int]) -> np.ndarray:
  """Source index per row of a slot: a source with n rows takes the places nearest (k + 1/2) / n, so any contiguous
  part of the slot (a micro-batch) holds every source. Read-only: each pattern is computed once."""
  return _interleave(tuple(counts))


@functools.lru_cache(maxsize=1024)
def _interleave(counts: tuple[int, ...]) -> np.ndarray:
  keys = np.concatenate([(np.arange(n) + 0.5) / n for n in counts if n] or [np.zeros(0)])
  owner = np.concatenate([np.full(n, i, np.int32) for i, n in enumerate(counts) if n] or [np.zeros(0, np.int32)])
  out = owner[np.lexsort((owner, keys))]
  out.setflags(write=False)
  return out


class Sampler:
  """The source of every row of this process's `slots` (virtual shards), `rows_per_slot` (B/V) each, step after step:
  `next()` gives {slot: index into mix.names per row}. The state is the step and each slot's credits."""

  def __init__(self, mix: Mixture, seed: int, rows_per_slot: int, slots: Iterable[int]):
    self.mix, self.seed, self.rows = mix, seed, rows_per_slot
    self.slots = list(slots)
    self.step = 0
    self.credits = {v: starting_credits(seed, v, mix.names) for v in self.slots}
    self._units: tuple[tuple[float, ...], list[int]] | None = None  # (weights, their units)

  def next(self) -> dict[int, np.ndarray]:
    key = tuple(s.weight_at(self.step) for s in self.mix.sources)
    if self._units is None or self._units[0] != key:  # weights change only at a schedule's start steps
      self._units = (key, self.mix.units_at(self.step))
    units, names = self._units[1], self.mix.names
    out = {}
    for v in self.slots:
      counts, credits = apportion(self.rows, [self.credits[v][n] for n in names], units)
      self.credits[v] = dict(zip(names, credits))
      out[v] = interleave(counts)
    self.step += 1
    return out

  def get_state(self) -> dict[str, Any]:
    return {
      'stream': STREAM,
      'step': self.step,
      'dirs': {s.name: s.dir for s in self.mix.sources},
      'slots': {str(v): {'credits': dict(self.credits[v])} for v in self.slots},
    }

  def set_state(self, state: dict[str, Any], fresh: Collection[str] = ()) -> None:
    """Resumes from `state` (of any process count, merged). A source added or moved since is refused unless named in
    `fresh` (it then starts as at step 0); a source removed is refused: the credits would no longer add up."""
    if not isinstance(state, dict) or state.get('stream') != STREAM:
      raise ValueError(f'not a {STREAM} state: {json.dumps(state)[:80]}')
    saved = {v: slot['credits'] for v, slot in state['slots'].items()}  # older states' rows 'taken' are not read
    missing = [v for v in self.slots if str(v) not in saved]
    if missing:
      raise ValueError(f'the mixture state holds no slot {missing[:4]}')
    if self.mix.plain:  # its one source, whatever its name, directory or place (data.dir is the resume check's)
      saved = {v: {self.mix.names[0]: next(iter(credits.values()))} for v, credits in saved.items()}
    else:
      self._check_sources(state['dirs'], set(fresh))
    self.step = int(state['step'])
    kept = [n for n in self.mix.names if n not in fresh]
    for v in self.slots:
      start = starting_credits(self.seed, v, self.mix.names)
      self.credits[v] = {**start, **{n: int(saved[str(v)][n]) for n in kept}}

  def _check_sources(self, before: dict[str, str], fresh: set[str]) -> None:
    now = {s.name: s.dir for s in self.mix.sources}
    changes = [(n, 'is gone') for n in sorted(set(before) - set(now))]
    changes += [(n, 'is new') for n in sorted(set(now) - set(before) - fresh)]
    changes += [
      (n, f'points to {now[n]}, not {before[n]}') for n in sorted(set(now) & set(before) - fresh) if now[n] != before[n]
    ]
    if changes:
      name, how = changes[0]
      raise errors.ConfigError(
        f'{self.mix.path}: source {name!r} {how} since the checkpoint; a resumed mixture may change only its '
        'weights: restore the source as it was, or start the new or moved sources fresh (docs/data.md)'
      )
