"""Where a split's shards end: the one rule both `prepare` engines apply (the local ShardWriter after every document,
the Ray driver on the documents' token counts, before any shard is written). A shard closes after the document that
brings its ids (`id_bytes` each) to the target size, so a document is never cut.
"""

from __future__ import annotations

import numpy as np


class Rollover:
  """The running token count of the open shard of one split."""

  def __init__(self, shard_bytes: int, id_bytes: int):
    self.target = max(1, -(-int(shard_bytes) // id_bytes))  # tokens * id_bytes >= shard_bytes
    self.tokens = 0

  def cuts(self, doc_tokens) -> list[int]:
    """For the next documents (their token counts, in order): the indices after which a shard closes."""
    sums = np.cumsum(np.asarray(doc_tokens, np.int64))
    out, base = [], 0
    while sums.size:
      at = int(np.searchsorted(sums, base + self.target - self.tokens, side='left'))
      if at >= sums.size:
        self.tokens += int(sums[-1]) - base
        break
      out.append(at)
      base, self.tokens = int(sums[at]), 0
    return out


def plan_shards(doc_tokens: list[np.ndarray], shard_bytes: int, id_bytes: int) -> list[list[tuple[int, int, int]]]:
  """The shards ShardWriter would make of a split from its documents' token counts per unit: (unit, first, end)s."""
  rule, plan, current = Rollover(shard_bytes, id_bytes), [], []
  for unit, tokens in enumerate(doc_tokens):
    first = 0
    for cut in rule.cuts(tokens):
      current.append((unit, first, cut + 1))
      plan.append(current)
      current, first = [], cut + 1
    if first < len(tokens):
      current.append((unit, first, len(tokens)))
  return plan + ([current] if current else [])
