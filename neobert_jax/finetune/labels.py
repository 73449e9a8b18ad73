"""The label mapping: raw labels (strings, any integers such as -1/1, floats) <-> class ids, saved with the run.

Classification ids follow the sorted order of the training labels, so the same data always gives the same ids;
`WORKDIR/labels.json` records the mapping, and the export writes it into config.json (id2label / label2id).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from neobert_jax import paths
from neobert_jax.errors import DataError

LABELS_FILE = 'labels.json'


@dataclasses.dataclass(frozen=True)
class LabelSpec:
  kind: str  # 'classification' or 'regression'
  names: tuple[str, ...]  # class id -> label as text (empty for regression)
  values: tuple[Any, ...]  # class id -> the raw value (int or str) as it appeared in the data

  @property
  def num_outputs(self) -> int:
    return 1 if self.kind == 'regression' else len(self.names)

  def to_json(self) -> dict[str, Any]:
    return {'kind': self.kind, 'id2label': dict(enumerate(self.names)), 'values': list(self.values)}

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> 'LabelSpec':
    names = tuple(d['id2label'][k] for k in sorted(d['id2label'], key=int))
    return cls(d['kind'], names, tuple(d['values']))


def _is_number(v: Any) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def infer(values: Sequence[Any], task_type: str, where: str) -> LabelSpec:
  """Builds the mapping from the training labels ('auto': non-integral numbers mean regression)."""
  if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
    raise DataError(f'{where}: some rows have no label; fill or drop them')
  numeric = all(_is_number(v) for v in values)
  integral = numeric and all(float(v).is_integer() for v in values)
  kind = task_type if task_type != 'auto' else ('regression' if numeric and not integral else 'classification')
  if kind == 'regression':
    if not numeric:
      raise DataError(
        f'{where}: regression needs numeric labels; found {next(v for v in values if not _is_number(v))!r}'
      )
    return LabelSpec('regression', (), ())
  raw = sorted({int(v) for v in values}) if integral else sorted({str(v) for v in values})
  if len(raw) < 2:
    raise DataError(f'{where}: only one label value {raw}; classification needs at least two classes')
  return LabelSpec('classification', tuple(str(v) for v in raw), tuple(raw))


def encode_labels(spec: LabelSpec, values: Sequence[Any], where: str) -> np.ndarray:
  """Class ids (int32) or regression targets (float32)."""
  if spec.kind == 'regression':
    return np.asarray(values, np.float32)
  index = {str(int(v)) if _is_number(v) else str(v): i for i, v in enumerate(spec.values)}
  keys = [str(int(v)) if _is_number(v) and float(v).is_integer() else str(v) for v in values]
  unknown = sorted({k for k in keys if k not in index})
  if unknown:
    raise DataError(f'{where}: labels {unknown[:5]} do not occur in the training data {list(spec.names)}')
  return np.asarray([index[k] for k in keys], np.int32)


def check_same_labels(spec: LabelSpec, val_values: Sequence[Any], where: str) -> None:
  """A validation set whose label set differs from training's means the two files do not describe one task."""
  if spec.kind == 'regression':
    return
  val = {str(int(v)) if _is_number(v) and float(v).is_integer() else str(v) for v in val_values}
  train = set(spec.names)
  if val != train:
    raise DataError(
      f'{where}: validation labels {sorted(val)} differ from training labels {sorted(train)} '
      f'(only in validation: {sorted(val - train)}, only in training: {sorted(train - val)}); '
      'use files of the same task, or drop data.validation_file to hold out part of the train file'
    )


def save_labels(spec: LabelSpec, workdir: str | Path) -> Path:
  path = paths.resolved(workdir) / LABELS_FILE
  paths.write_text(path, json.dumps(spec.to_json(), indent=2) + '\n')
  return path


def load_labels(workdir: str | Path) -> LabelSpec:
  return LabelSpec.from_json(json.loads((paths.resolved(workdir) / LABELS_FILE).read_text()))
