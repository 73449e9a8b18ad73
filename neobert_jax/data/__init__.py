"""Data: from raw text to the batches a host feeds its devices, in two subpackages and a shared base.

  prepare/   offline: raw text -> ArrayRecord shards + manifest.json (local and Ray engines), run once per corpus
  pipeline/  online: prepared shards -> packed, masked batches, per host, while training runs
  shards.py, rollover.py   the prepared-data format both sides share (manifest, shards, where a shard ends)
  tokenizer.py, assets.py  tokenizers, and the download cache of files fetched from the package registry
  mixture.py               weighted mixtures of prepared directories, and which source each row of a step comes from

Nothing is imported here, so `prepare` does not pay for Grain and the trainer does not pay for the Ray engine.
"""
