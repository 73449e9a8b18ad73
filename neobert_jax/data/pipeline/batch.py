"""The batch contract between the data pipeline and the train step, written once.

One host batch is a dict of numpy arrays, one row per sequence:

  key            shape   dtype    meaning
  input_ids      [B, T]  int32    token ids (masked tokens replaced), pad id after the last document
  positions      [B, T]  int32    position within the document (restarts at 0 in every packed document)
  segment_ids    [B, T]  int32    1-based document number within the row, 0 on padding
  labels         [B, T]  int32    original id where the token carries the loss, -100 elsewhere
  mlm_positions  [B, P]  int32    (max_predictions P > 0) positions carrying the loss, 0 in unused slots
  mlm_labels     [B, P]  int32    their original ids
  mlm_weights    [B, P]  float32  1 for a used slot, 0 for an unused one

The pipeline emits every key; the train step reads `step_keys(P)` and stacks A micro-batches in front ([A, M, ...]).
Packed rows hold at most data.max_documents_per_row documents (the pipeline closes a row early, the step checks it).
"""

import numpy as np

ROW_KEYS = ('input_ids', 'positions', 'segment_ids', 'labels')  # [B, T]
SLOT_KEYS = ('mlm_positions', 'mlm_labels', 'mlm_weights')  # [B, P]
DTYPES = {k: np.dtype(np.int32) for k in ROW_KEYS + SLOT_KEYS} | {'mlm_weights': np.dtype(np.float32)}


def step_keys(max_predictions: int) -> tuple[str, ...]:
  """What the train step reads: the sparse MLM slots when P > 0, else the dense labels."""
  return ROW_KEYS[:3] + SLOT_KEYS if max_predictions > 0 else ROW_KEYS


def row_shapes(seq_len: int, max_predictions: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """Per-row (shape, dtype) of every key the step reads."""
  width = {k: seq_len for k in ROW_KEYS} | {k: max_predictions for k in SLOT_KEYS}
  return {k: ((width[k],), DTYPES[k]) for k in step_keys(max_predictions)}
