"""Sizing the bucket cache (cache_need, neobert_jax/data/pipeline/factories.py): what one process must hold is the
windows one block can touch plus the next, per virtual shard. The refusal of a budget too small, on a real bucket, is
tests/test_scenario_data_on_a_bucket.py's."""

from neobert_jax.data.pipeline import factories, virtual


def _stream(files, records, window, shard=0):
  counts = [records] * files
  return virtual.ShardStream(virtual.pieces(counts, 0, sum(counts)), seed=0, shard=shard, window=window, shuffle=True)


def test_the_need_is_the_windows_a_block_touches_plus_the_next():
  listed = [{'bytes': 100 * (f + 1)} for f in range(6)]  # files of 100 .. 600 bytes, 10 records each
  one_window = _stream(6, 10, window=1)
  # a block of 5 records touches at most 2 one-file windows, and the next one is fetched: the 3 largest files
  assert factories.cache_need([one_window], listed, block_docs=5) == 600 + 500 + 400
  # a block of 25 records spans up to 4 windows: 5 files in all
  assert factories.cache_need([one_window], listed, block_docs=25) == 600 + 500 + 400 + 300 + 200
  # never more than every file the shard reads
  assert factories.cache_need([one_window], listed, block_docs=10_000) == sum(f['bytes'] for f in listed)
  # two virtual shards need theirs each
  assert factories.cache_need([one_window, _stream(6, 10, window=1, shard=1)], listed, block_docs=5) == 2 * 1500
