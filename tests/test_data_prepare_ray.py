"""`prepare --engine=ray` on a real Ray cluster on 127.0.0.1 (a head with no CPU and two 1-CPU nodes, started and
shut down here), compared with the local engine on the same inputs and flags: the same shard bytes and the same
manifest but for its run fields, from JSONL, gzip, multi-frame and seekable zstd, Parquet and text spread over
several files with one large file cut into parts; bad input and an existing output as on the local engine; an
unreachable cluster as one line; inputs and output on a GCS server; a driver killed with kill -9 resumed from the
ledger; a node removed mid-build. No mocks: real tasks, real node processes, a real bucket server."""

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from neobert_jax import errors, paths
from neobert_jax.data import shards
from tests.support import synthetic_data
from neobert_jax.data.prepare import ray_engine
from neobert_jax.data.prepare import local as prepare_lib

ray = pytest.importorskip('ray')
from ray.cluster_utils import Cluster  # noqa: E402  pylint: disable=g-import-not-at-top

from test_data_prepare import _seekable_zst  # noqa: E402  the .zst writer of the parts test

# A real cluster on 127.0.0.1 (server), except the unreachable address, which needs none.

WORDS = ('the', 'cat', 'sat', 'on', 'mat', 'dog', 'ran', 'far', 'away', 'home')
FLAGS = dict(max_length=16, eval_fraction=0.1, shard_mb=0.02)
# The manifest (neobert_jax/data/prepare/local.py) fields that say how and when a prepare ran rather than what it made: the engines differ only there.
RUN_FIELDS = ('command', 'seconds', 'workers', 'engine')
SPLIT_MB = 0.01  # the large JSONL becomes ~20 parts, the zstd files several runs of frames, the Parquet several
# Ray's processes listen on loopback only with the first (by default the GCS advertises the machine's interface
# address); the second keeps Ray from reporting usage statistics over the network.
LOOPBACK = {'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER': '0', 'RAY_USAGE_STATS_ENABLED': '0'}


@pytest.fixture(scope='module')
def cluster(gcs):  # the bucket server first: the nodes' workers inherit its address from this environment
  saved = {k: os.environ.get(k) for k in LOOPBACK}
  os.environ.update(LOOPBACK)
  c = Cluster(
    initialize_head=True, head_node_args=dict(num_cpus=0, object_store_memory=100 * 2**20, include_dashboard=False)
  )
  for _ in range(2):
    c.add_node(num_cpus=1, object_store_memory=100 * 2**20)
  c.wait_for_nodes()
  yield c
  c.shutdown()
  for k, v in saved.items():
    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope='module')
def driver(cluster):
  """This process as the cluster's driver for the module: one job, so the nodes' worker processes (and their
  imports) are started once rather than for every build."""
  ray.init(address=cluster.address, log_to_driver=False)
  yield cluster
  ray.shutdown()


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
  return synthetic_data.write_wordpiece_vocab(str(tmp_path_factory.mktemp('vocab') / 'vocab.txt'), WORDS)


def _corpus(directory, seed=0, bad_line=None):
  rng = np.random.default_rng(seed)
  docs = [' '.join(rng.choice(WORDS, rng.integers(0, 50))) for _ in range(2400)]
  lines = lambda part: ''.join(json.dumps({'text': d}) + '\n' for d in part)
  big = lines(docs[:1400]).splitlines(keepends=True)
  if bad_line is not None:
    big[bad_line] = '{oops\n'
  directory.mkdir(parents=True)
  (directory / 'a.jsonl').write_text(''.join(big))  # ~100 KB: cut into parts
  (directory / 'b.jsonl.gz').write_bytes(gzip.compress(lines(docs[1400:1600]).encode()))
  data = lines(docs[1600:1900]).encode()
  frames = [data[i : i + 2000] for i in range(0, len(data), 2000)]  # frames end mid-line
  c = zstandard.ZstdCompressor()
  (directory / 'c.jsonl.zst').write_bytes(b''.join(c.compress(f) for f in frames))
  (directory / 'd.jsonl.zst').write_bytes(_seekable_zst(frames))
  pq.write_table(pa.table({'text': docs[1900:2300]}), directory / 'e.parquet', row_group_size=40)
  (directory / 'f.txt').write_bytes('\n'.join(docs[2300:]).encode() + b'\nbad \xff byte\n\n')
  return directory


@pytest.fixture(scope='module')
def local(vocab, tmp_path_factory):
  """The corpus and what the local engine (2 worker processes) makes of it."""
  raw = _corpus(tmp_path_factory.mktemp('raw') / 'raw')
  out = str(tmp_path_factory.mktemp('local') / 'out')
  return raw, out, prepare_lib.prepare_local([str(raw)], out, tokenizer=vocab, workers=2, **FLAGS)


def _ray(inputs, out, vocab, cluster, **kw):  # joins the cluster unless this process is its driver already
  from neobert_jax.data.prepare import ray_engine as prepare_ray  # pylint: disable=g-import-not-at-top

  return prepare_ray.prepare_on_ray(
    inputs, out, ray_address=cluster.address, tokenizer=vocab, split_mb=SPLIT_MB, **FLAGS, **kw
  )


def _same(local_out, local_manifest, out, manifest, also=()):
  """The Ray build's manifest and shard bytes equal the local engine's, and no work area is left."""
  drop = lambda m: {k: v for k, v in m.items() if k not in RUN_FIELDS + tuple(also)}
  assert drop(manifest) == drop(local_manifest)
  for name in shards.Manifest.of(local_manifest).files():  # each shard, byte for byte
    assert paths.Path(f'{out}/{name}').read_bytes() == paths.Path(f'{local_out}/{name}').read_bytes(), name
  left = sorted(p.name for p in paths.Path(out).iterdir())
  assert left == sorted(['manifest.json'] + shards.Manifest.of(manifest).files())


def test_an_unreachable_cluster_is_one_line_before_any_work(vocab, tmp_path, capsys):
  assert not ray.is_initialized(), 'runs first: a driver already connected uses its own cluster'
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    address = f'127.0.0.1:{s.getsockname()[1]}'  # nothing listens there once closed
  (tmp_path / 'in.txt').write_text('the cat\n')
  with pytest.raises(SystemExit) as stop:
    prepare_lib.main(
      [
        '--input',
        str(tmp_path / 'in.txt'),
        '--output',
        str(tmp_path / 'out'),
        '--tokenizer',
        vocab,
        '--engine=ray',
        f'--ray-address={address}',
      ]
    )
  err = capsys.readouterr().err.strip().splitlines()
  assert stop.value.code == 12 and len(err) == 1
  assert err[0].startswith(f'prepare: distributed error: --ray-address={address}: no Ray cluster answers there')
  assert 'ray start --head' in err[0] and not (tmp_path / 'out').exists()


@pytest.mark.server
def test_ray_engine_writes_the_local_engines_shards(driver, vocab, local, tmp_path):
  raw, local_out, lm = local
  assert len(lm['splits']['train']['shards']) > 3 and lm['decode_errors']['count'] == 1
  m = _ray([str(raw)], str(tmp_path / 'out'), vocab, driver)
  _same(local_out, lm, str(tmp_path / 'out'), m)
  assert m['format'] == shards.FORMAT and m['id_dtype'] == 'uint16'  # two bytes per token, on both engines
  engine = m['engine']
  assert engine['units'] > 20 and engine['resumed_units'] == 0 and len(engine['nodes']) == 2
  assert sum(n['units'] for n in engine['nodes'].values()) == engine['units']
  assert (
    sum(n['tokens'] for n in engine['nodes'].values())
    == lm['splits']['train']['tokens'] + lm['splits']['eval']['tokens']
  )


@pytest.mark.server
def test_a_vocabulary_of_65536_ids_or_more_gives_int32_shards_as_on_the_local_engine(driver, tmp_path):
  words = WORDS + tuple(f'w{i}' for i in range(66_000))
  big = synthetic_data.write_wordpiece_vocab(str(tmp_path / 'vocab.txt'), words)
  rng = np.random.default_rng(1)
  raw = tmp_path / 'raw.jsonl'
  raw.write_text(''.join(json.dumps({'text': ' '.join(rng.choice(words[-50:], 20))}) + '\n' for _ in range(300)))
  lm = prepare_lib.prepare_local([str(raw)], str(tmp_path / 'local'), tokenizer=big, workers=0, **FLAGS)
  m = _ray([str(raw)], str(tmp_path / 'ray'), big, driver)
  _same(str(tmp_path / 'local'), lm, str(tmp_path / 'ray'), m)
  assert m['id_dtype'] == 'int32' and m['engine']['units'] > 1 and len(m['splits']['train']['shards']) > 1


@pytest.mark.server
def test_bad_input_and_an_existing_output_as_on_the_local_engine(driver, vocab, local, tmp_path):
  raw = _corpus(tmp_path / 'raw', bad_line=1100)  # in a late part of a.jsonl
  with pytest.raises(errors.DataError) as on_local:
    prepare_lib.prepare_local([str(raw)], str(tmp_path / 'local'), tokenizer=vocab, **FLAGS)
  with pytest.raises(errors.DataError) as on_ray:
    _ray([str(raw)], str(tmp_path / 'ray'), vocab, driver)
  assert str(on_ray.value) == str(on_local.value) and 'a.jsonl:1101 ' in str(on_ray.value)
  # Neither engine leaves a directory behind (nor its lease), as the local engine does not.
  assert not (tmp_path / 'ray').exists() and not (tmp_path / 'local').exists()
  raw, local_out, lm = local
  out = tmp_path / 'existing'
  out.mkdir()
  (out / 'manifest.json').write_text('{}')
  (out / 'train-00099.arrayrecord').write_text('old')
  with pytest.raises(FileExistsError, match='--overwrite'):
    _ray([str(raw)], str(out), vocab, driver)
  assert sorted(os.listdir(out)) == ['manifest.json', 'train-00099.arrayrecord']  # untouched
  _same(local_out, lm, str(out), _ray([str(raw)], str(out), vocab, driver, overwrite=True))


@pytest.mark.server
def test_from_and_to_a_bucket(driver, gcs, vocab, local, tmp_path):
  raw, local_out, lm = local
  root = f'{gcs}/ray-{os.getpid()}'
  for f in sorted(raw.iterdir()):
    paths.copy(paths.Path(f), paths.Path(f'{root}/raw/{f.name}'))
  m = _ray([f'{root}/raw'], f'{root}/out', vocab, driver)
  assert m['input_files'] == [f'{root}/raw/{f.name}' for f in sorted(raw.iterdir())]
  _same(local_out, lm, f'{root}/out', m, also=('input_files', 'decode_errors'))  # both name the file by its URL
  assert m['decode_errors']['first'] == [e.replace(str(raw), f'{root}/raw') for e in lm['decode_errors']['first']]
  assert m['engine']['units'] > 20  # the seekable .zst is cut on the bucket too (its seek table)


@pytest.mark.server
def test_a_driver_killed_mid_build_resumes_from_the_ledger(driver, vocab, local, tmp_path):
  raw, local_out, lm = local
  out = str(tmp_path / 'out')
  script = (
    f'from neobert_jax.data.prepare import ray_engine as prepare_ray\n'
    f'prepare_ray.prepare_on_ray([{str(raw)!r}], {out!r}, ray_address={driver.address!r}, tokenizer={vocab!r}, '
    f'split_mb={SPLIT_MB}, **{FLAGS!r})\n'
  )
  proc = subprocess.Popen(
    [sys.executable, '-c', script], env={**os.environ, **LOOPBACK}, cwd=os.path.dirname(os.path.dirname(__file__))
  )
  units = paths.Path(out) / ray_engine.WORK / 'units'
  deadline = time.time() + 60
  while time.time() < deadline and proc.poll() is None:
    if units.exists() and any(p.name.endswith('.done.npz') for p in units.iterdir()):
      break
    time.sleep(0.01)
  assert proc.poll() is None, 'the build ended before it could be killed'
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (paths.Path(out) / 'manifest.json').exists()
  m = _ray([str(raw)], out, vocab, driver)
  assert 1 <= m['engine']['resumed_units'] < m['engine']['units']
  _same(local_out, lm, out, m)


@pytest.mark.server
def test_a_node_removed_mid_build_still_gives_the_same_shards(driver, vocab, local, tmp_path):
  raw, local_out, lm = local
  out = str(tmp_path / 'out')
  result = {}
  build = threading.Thread(target=lambda: result.update(m=_ray([str(raw)], out, vocab, driver)))
  build.start()
  units = paths.Path(out) / ray_engine.WORK / 'units'
  deadline = time.time() + 60
  while time.time() < deadline and build.is_alive():
    if units.exists() and any(p.name.endswith('.done.npz') for p in units.iterdir()):
      break
    time.sleep(0.01)
  assert build.is_alive(), 'the build ended before a node could be removed'
  gone = next(iter(driver.worker_nodes))
  driver.remove_node(gone)
  build.join(timeout=120)
  assert 'm' in result, 'the build did not finish on the remaining node'
  _same(local_out, lm, out, result['m'])
  nodes = result['m']['engine']['nodes']  # every shard (pass 2) was made after the node had gone
  assert nodes.get(gone.node_id, {}).get('shards', 0) == 0 and sum(n['shards'] for n in nodes.values()) > 3
