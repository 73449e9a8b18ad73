"""Labelled example files (CSV, TSV, JSONL, Parquet, compressed too) read into columns through pyarrow, so types are
inferred the same way whatever the format."""

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from neobert_jax import errors, paths
from neobert_jax.errors import DataError

_COMPRESSIONS = ('.gz', '.bz2', '.zst', '.zstd', '.lz4')
_FORMATS = {'.csv': 'csv', '.tsv': 'tsv', '.parquet': 'parquet', '.pq': 'parquet'}  # by the last suffix
_FORMATS.update(dict.fromkeys(('.jsonl', '.json', '.ndjson'), 'jsonl'))


def _local(path: str) -> str:
  """A bucket file (gs://) as a local copy; a local path as it is."""
  if path and paths.is_url(path):
    try:
      return str(paths.local_copy(path))
    except FileNotFoundError:
      raise DataError(f'{path}: no such file; check data.train_file / data.validation_file') from None
  return path


def read_table(path: str, fmt: str = 'auto') -> dict[str, list[Any]]:
  """{column: values} of a data file (local or gs://); DataError if it is missing, unreadable or has no rows."""
  import pyarrow  # pylint: disable=g-import-not-at-top
  from pyarrow import csv as pc, json as pj, parquet as pq  # pylint: disable=g-import-not-at-top

  path = _local(path)
  if not path or not Path(path).is_file():
    raise DataError(f'{path or "(no path)"}: no such file; check data.train_file / data.validation_file')
  if fmt == 'auto':
    suffixes = [s.lower() for s in Path(path).suffixes]
    while suffixes and suffixes[-1] in _COMPRESSIONS:
      suffixes.pop()
    ext = suffixes[-1] if suffixes else ''
    if ext not in _FORMATS:
      raise DataError(
        f'{path}: cannot tell the format from the suffix {ext!r}; name it .csv, .tsv, .jsonl or '
        '.parquet, or set --config.data.format'
      )
    fmt = _FORMATS[ext]
  if Path(path).stat().st_size == 0:
    raise DataError(f'{path}: the file is empty; give a file with a header and at least one example')
  try:
    if fmt == 'parquet':
      table = pq.read_table(path)
    elif fmt == 'jsonl':
      table = pj.read_json(path)
    else:
      # GLUE TSVs contain unbalanced quotes inside sentences: tabs separate, quotes mean nothing.
      parse = pc.ParseOptions(delimiter='\t', quote_char=False) if fmt == 'tsv' else pc.ParseOptions()
      table = pc.read_csv(path, parse_options=parse)
  except (pyarrow.ArrowInvalid, OSError, ValueError) as e:
    first = errors.one_line(e, first=True)
    raise DataError(f'{path}: cannot be read as {fmt} ({first}); check the file or set --config.data.format') from None
  if table.num_rows == 0:
    raise DataError(f'{path}: no examples (only a header or nothing); give at least one row')
  return {name: table.column(name).to_pylist() for name in table.column_names}


def require_columns(table: dict[str, list[Any]], path: str, fields: Sequence[tuple[str, str]]) -> None:
  """fields: (config field, column name); DataError naming the missing column, what exists, and the override."""
  for field, column in fields:
    if column and column not in table:
      raise DataError(
        f'{path}: no column {column!r} (set by {field}); the file has columns {sorted(table)}; '
        f'fix with ' + (f'{field}=NAME' if field.startswith('--') else f'--config.{field}=NAME')
      )


def texts(table: dict[str, list[Any]], column: str, path: str) -> list[str]:
  """A text column as strings; a missing value is an error (an empty string is allowed)."""
  values = table[column]
  missing = [i for i, v in enumerate(values) if v is None]
  if missing:
    raise DataError(
      f'{path}: column {column!r} has no value in {len(missing)} rows (first: row {missing[0] + 1}); '
      'fill or drop those rows'
    )
  return [str(v) for v in values]


def split_holdout(
  n: int, fraction: float, seed: int, strata: Sequence[Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """(train rows, validation rows): a seeded split, stratified by `strata` (labels) so every class is in both."""
  rng = np.random.default_rng(seed)
  groups: dict[Any, list[int]] = {}
  for i in range(n):
    groups.setdefault(strata[i] if strata is not None else 0, []).append(i)
  train, val = [], []
  for key in sorted(groups, key=str):
    rows = np.array(groups[key])
    rng.shuffle(rows)
    k = int(round(len(rows) * fraction))
    k = min(max(k, 1), len(rows) - 1) if len(rows) > 1 else 0
    val += rows[:k].tolist()
    train += rows[k:].tolist()
  if not val or not train:
    raise DataError(
      f'cannot hold out {fraction:.0%} of {n} rows for validation; give data.validation_file or more rows'
    )
  return np.sort(np.array(train)), np.sort(np.array(val))


def read_texts(path: str, field: str = 'text') -> list[str]:
  """Texts to embed or score: a .txt file (one text per non-empty line) or a column of any table format."""
  path = _local(path)
  if Path(path).suffix.lower() == '.txt':
    if not Path(path).is_file():
      raise DataError(f'{path}: no such file')
    lines = [line.strip() for line in Path(path).read_text(encoding='utf-8', errors='replace').splitlines()]
    out = [line for line in lines if line]
    if not out:
      raise DataError(f'{path}: no text (the file is empty)')
    return out
  table = read_table(path)
  require_columns(table, path, [('--text-field', field)])
  return texts(table, field, path)
