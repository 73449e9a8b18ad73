"""The shard stores (neobert_jax/data/pipeline/store.py) both implement the one declared interface,
store.Store, that the readers use; a local store reads a prepared directory's records in place."""

import inspect
import typing

import pytest

from neobert_jax.data import shards
from neobert_jax.data.pipeline import store
from tests.support import synthetic_data

_METHODS = [n for n, v in vars(store.Store).items() if inspect.isfunction(v) and not n.startswith('_')]


@pytest.mark.parametrize('cls', [store.LocalStore, store.BucketStore])
def test_every_store_implements_the_interface(cls):
  assert sorted(_METHODS) == ['acquire', 'close', 'prefetch', 'read', 'release']
  for name in _METHODS:
    want = inspect.signature(getattr(store.Store, name))
    got = inspect.signature(getattr(cls, name))
    assert list(got.parameters) == list(want.parameters), (cls.__name__, name)
  assert isinstance(cls.caches, bool)
  assert set(typing.get_type_hints(store.Store)) == {'caches', 'stats'}


def test_a_local_store_is_a_store_and_reads_records_in_place(tmp_path):
  docs = synthetic_data.synthetic_documents(20, seed=0, max_len=50)
  synthetic_data.write_prepared(str(tmp_path), docs)
  manifest = shards.Manifest.read(str(tmp_path))
  listed = manifest.shards('train')
  local = store.LocalStore(str(tmp_path), listed)
  assert isinstance(local, store.Store)
  (got,) = local.read(listed[0]['file'], [3])
  assert (shards.decode(got, manifest.id_dtype) == docs[3]).all()
  local.close()
