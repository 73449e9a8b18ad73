"""Hugging Face datasets as `prepare` inputs: hf:ID[:CONFIG[:SPLIT]] (streamed) or a save_to_disk folder, read in
row order from the --text-field column; `datasets` is imported only when such an input is read."""

import json
import os
from typing import Iterator

from neobert_jax import errors

PREFIX = 'hf:'
DEFAULT_SPLIT = 'train'
_BATCH = 1024


def is_input(item: str) -> bool:
  """Whether `item` names a hub dataset or a local folder written by save_to_disk (a Dataset or a DatasetDict)."""
  marks = ('state.json', 'dataset_dict.json')
  return item.startswith(PREFIX) or (os.path.isdir(item) and any(os.path.isfile(os.path.join(item, f)) for f in marks))


def _datasets():
  try:
    import datasets  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.DataError(
      'reading a Hugging Face dataset needs the datasets library: pip install "datasets==5.0.1"'
    ) from None
  return datasets


def hub_spec(item: str) -> tuple[str, str | None, str]:
  """(id, config or None, split) of 'hf:ID[:CONFIG[:SPLIT]]'."""
  parts = item[len(PREFIX) :].split(':')
  if not parts[0] or len(parts) > 3:
    raise errors.DataError(f'{item}: expected hf:ID, hf:ID:CONFIG or hf:ID:CONFIG:SPLIT (e.g. hf:allenai/c4:en)')
  name, config, split = (parts + ['', ''])[:3]
  return name, config or None, split or DEFAULT_SPLIT


def _hub_rows(item: str):
  name, config, split = hub_spec(item)
  load = _datasets().load_dataset
  try:
    return load(name, config, split=split, streaming=True)
  except Exception as e:  # noqa: BLE001 - the hub client raises many types (offline, not found, gated, bad split)
    raise errors.DataError(
      f'{item}: cannot stream {name!r} (config {config!r}, split {split!r}): {errors.one_line(e)}'
    ) from None


def _saved_rows(item: str):
  if os.path.isfile(os.path.join(item, 'dataset_dict.json')):
    with open(os.path.join(item, 'dataset_dict.json')) as f:
      splits = json.load(f).get('splits', [])
    if DEFAULT_SPLIT not in splits:
      raise errors.DataError(
        f'{item}: a saved DatasetDict without a {DEFAULT_SPLIT!r} split; pass {item}/SPLIT, SPLIT one of {splits}'
      )
    item = os.path.join(item, DEFAULT_SPLIT)
  load = _datasets().load_from_disk
  try:
    return load(item)
  except Exception as e:  # noqa: BLE001 - damaged or foreign folders fail in many ways
    raise errors.DataError(f'{item}: not a readable save_to_disk folder ({errors.one_line(e)})') from None


def iter_texts(item: str, text_field: str) -> Iterator[tuple[int, str]]:
  """(row number, text) of each row of the dataset named by `item` (is_input), in order; None text is ''."""
  rows = _hub_rows(item) if item.startswith(PREFIX) else _saved_rows(item)
  columns = rows.column_names  # None for a stream whose features are known only once rows arrive
  if columns is not None and text_field not in columns:
    raise errors.DataError(f'{item}: no column {text_field!r} (columns: {columns}); choose one with --text-field')
  batches = rows.select_columns([text_field]).iter(batch_size=_BATCH)
  for row, text in enumerate(t for batch in batches for t in batch[text_field]):
    if text is not None and not isinstance(text, str):
      raise errors.DataError(f'{item}: row {row}: column {text_field!r} is not a string column')
    yield row, text or ''
