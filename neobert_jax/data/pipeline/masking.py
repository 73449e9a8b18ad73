"""MLM masking of packed rows, vectorised over a whole block.

Each real, non-special token is chosen independently with probability `rate` (as Hugging Face's collator, which
NeoBERT used, does), then becomes [MASK] ('all_mask') or follows BERT's 80/10/10 rule. With max_predictions = P > 0
a row that drew more than P keeps the P smallest draws (a uniform subset), so input_ids, labels and slots agree.
"""

import numpy as np

IGNORE = -100  # label of positions that carry no loss


def special_table(vocab_size: int, special_ids) -> np.ndarray:
  """Boolean lookup: is this id one that masking must never choose."""
  table = np.zeros(vocab_size, bool)
  table[np.asarray(list(special_ids), np.int64)] = True
  return table


def mask_rows(
  input_ids: np.ndarray,
  segment_ids: np.ndarray,
  rng: np.random.Generator,
  *,
  rate: float,
  strategy: str,
  mask_id: int,
  is_special: np.ndarray,
  max_predictions: int = 0,
) -> dict:
  """Returns masked input_ids, dense labels and, if max_predictions, the slots."""
  draws = rng.random(input_ids.shape, dtype=np.float32)
  chosen = (draws < rate) & (segment_ids > 0) & ~is_special[input_ids]
  over = np.flatnonzero(chosen.sum(axis=1) > max_predictions) if max_predictions > 0 else []
  if len(over):  # rows that drew more than P keep the P chosen positions with the smallest draws
    keys = np.where(chosen[over], draws[over], np.inf)
    keep = np.argpartition(keys, max_predictions - 1, axis=1)[:, :max_predictions]
    capped = np.zeros((over.size, chosen.shape[1]), bool)
    np.put_along_axis(capped, keep, True, axis=1)
    chosen[over] = capped
  out = {'labels': np.where(chosen, input_ids, IGNORE).astype(np.int32)}
  if strategy == 'all_mask':
    out['input_ids'] = np.where(chosen, np.int32(mask_id), input_ids)
  elif strategy == 'bert_80_10_10':
    masked = input_ids.copy()
    flat = np.flatnonzero(chosen)
    how = rng.random(flat.size, dtype=np.float32)
    masked.flat[flat[how < 0.8]] = mask_id
    swap = flat[(how >= 0.8) & (how < 0.9)]
    random_ids = rng.integers(0, is_special.size, swap.size, dtype=np.int32)
    # A special id drawn as the "random token" would put [CLS]/[PAD] mid-text: those positions keep their token.
    ok = ~is_special[random_ids]
    masked.flat[swap[ok]] = random_ids[ok]
    out['input_ids'] = masked
  else:
    raise ValueError(f"mask strategy must be 'all_mask' or 'bert_80_10_10', got {strategy!r}")
  if max_predictions > 0:  # the slots
    rows, cols = np.nonzero(chosen)  # row-major: positions come out sorted per row
    per_row = chosen.sum(axis=1)
    slot = np.arange(rows.size) - (np.cumsum(per_row) - per_row)[rows]
    shape = (chosen.shape[0], max_predictions)  # empty slots: position 0, id 0, weight 0
    out['mlm_positions'], out['mlm_labels'] = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    out['mlm_weights'] = np.zeros(shape, np.float32)
    out['mlm_positions'][rows, slot] = cols
    out['mlm_labels'][rows, slot] = input_ids[rows, cols]
    out['mlm_weights'][rows, slot] = 1.0
  return out


def thin(batch: dict, keep: float, rng: np.random.Generator) -> dict:
  """`batch` with each masked token kept with probability `keep`, the others restored (no label, no slot weight):
  masking at rate r then thinning masks at rate r x keep, as masking at that rate directly would."""
  if keep >= 1.0:
    return batch
  labels = batch['labels']
  restore = (labels != IGNORE) & (rng.random(labels.shape, dtype=np.float32) >= keep)
  out = dict(batch)
  out['input_ids'] = np.where(restore, labels, batch['input_ids']).astype(np.int32)
  out['labels'] = np.where(restore, IGNORE, labels).astype(np.int32)
  if 'mlm_weights' in batch:
    dropped = np.take_along_axis(restore, batch['mlm_positions'], axis=1)
    out['mlm_weights'] = np.where(dropped, 0.0, batch['mlm_weights']).astype(np.float32)
  return out
