"""Packing and masking one block of documents into rows: the per-block map of every pipeline (train and held-out).

A block is `block_docs` documents of one virtual shard (virtual.py); BlockBuilder packs them into
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

  def __init__(self, seq_len: int, seed: int, shard: int, pack: dict, mask: dict):
    self.seq_len, self.seed, self.shard, self.pack, self.mask = seq_len, seed, shard, pack, mask

  @classmethod
  def for_source(
    cls, data_cfg: ml_collections.ConfigDict, manifest: shards.Manifest, seq_len: int, seed: int, shard: int
  ) -> 'BlockBuilder':
    """The builder of virtual shard `shard` of the prepared data `manifest` describes, as `data_cfg` packs and
    masks it."""
    special = manifest.special_ids
    pack = {'mode': data_cfg.packing, 'pad_id': special['pad'], 'max_docs': data_cfg.max_documents_per_row}
    mask = {
      'rate': data_cfg.mask_rate,
      'strategy': data_cfg.mask_strategy,
      'mask_id': special['mask'],
      'is_special': masking.special_table(manifest.vocab_size, special.values()),
      'max_predictions': data_cfg.max_predictions,
    }
    return cls(seq_len, seed, shard, pack, mask)

  def __call__(self, index: int, block) -> dict:
    tokens, lengths = block
    rng = np.random.default_rng([self.seed, self.shard, index])
    rows = packing.pack_block(tokens, lengths, self.seq_len, rng=rng, **self.pack)
    rows.update(masking.mask_rows(rows['input_ids'], rows['segment_ids'], rng, **self.mask))
    return rows
