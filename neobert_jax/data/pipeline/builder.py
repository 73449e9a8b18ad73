"""Packing and masking one block of documents into rows: the per-block map of every pipeline (train and held-out).

A block is `block_docs` documents of one virtual shard (virtual.py, blocks.py); BlockBuilder packs them into
seq_len rows (packing.py) and masks the rows (masking.py), with randomness from (seed, virtual shard, block index)
alone, so a block is the same whichever process or worker builds it and however often it is rebuilt after a restore.
"""

import ml_collections
import numpy as np

from neobert_jax.data import shards
from neobert_jax.data.pipeline import masking
from neobert_jax.data.pipeline import packing


class BlockBuilder:
  """grain map_with_index: block index + (tokens, lengths) -> packed, masked rows (dicts of [rows, T] arrays)."""

  def __init__(
    self,
    *,
    seq_len: int,
    packing_mode: str,
    seed: int,
    rate: float,
    strategy: str,
    max_predictions: int,
    special: dict,
    vocab_size: int,
    max_docs: int = 0,
    shard: int = 0,
  ):
    self.seq_len, self.packing_mode, self.seed, self.shard = seq_len, packing_mode, seed, shard
    self.max_docs = max_docs
    self.rate, self.strategy, self.max_predictions = rate, strategy, max_predictions
    self.pad_id, self.mask_id = special['pad'], special['mask']
    self.is_special = masking.special_table(vocab_size, special.values())

  @classmethod
  def for_source(
    cls, data_cfg: ml_collections.ConfigDict, manifest: shards.Manifest, seq_len: int, seed: int, shard: int
  ) -> 'BlockBuilder':
    """The builder of virtual shard `shard` of the prepared data `manifest` describes, as `data_cfg` packs and
    masks it."""
    return cls(
      seq_len=seq_len,
      packing_mode=data_cfg.packing,
      seed=seed,
      rate=data_cfg.mask_rate,
      strategy=data_cfg.mask_strategy,
      max_predictions=data_cfg.max_predictions,
      special=manifest.special_ids,
      vocab_size=manifest.vocab_size,
      max_docs=data_cfg.max_documents_per_row,
      shard=shard,
    )

  def __call__(self, index: int, block) -> dict:
    tokens, lengths = block
    rng = np.random.default_rng([self.seed, self.shard, index])
    rows = packing.pack_block(
      tokens, lengths, self.seq_len, self.packing_mode, self.pad_id, rng, max_docs=self.max_docs
    )
    masked = masking.mask_rows(
      rows['input_ids'],
      rows['segment_ids'],
      rng,
      rate=self.rate,
      strategy=self.strategy,
      mask_id=self.mask_id,
      is_special=self.is_special,
      max_predictions=self.max_predictions,
    )
    rows.update(masked)
    return rows
