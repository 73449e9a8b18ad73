"""Online input pipeline: prepared shards -> this host's packed, masked batches, while training runs.

iterators.py builds the Grain datasets (train and held-out) and their resumable state; blocks.py says which
documents form a block, packing.py and masking.py turn a block into rows, batch.py is the batch contract with the
train step, virtual.py deals the corpus to hosts as virtual shards, store.py reads a host's shards in place or fetches
them from a bucket into a bounded cache. Reads prepared data only: the offline side
(data/prepare/) writes it.
"""
