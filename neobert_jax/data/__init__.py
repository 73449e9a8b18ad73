"""Data: raw text -> prepared shards (prepare/, offline, once per corpus) -> the packed, masked batches a host feeds
its devices (pipeline/, online), over a shared base: the prepared format (shards.py, where a shard ends too),
tokenizers and the download cache (tokenizer.py, assets.py), weighted mixtures of prepared directories (mixture.py).

Nothing is imported here, so `prepare` does not pay for Grain and the trainer does not pay for the Ray engine.
"""
