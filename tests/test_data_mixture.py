"""Weighted data mixtures (data/mixture.py): the mixture file and its refusals, the sources' prepared data checked
against each other and the model (through the pipeline's own open_prepared), and the sampler: realised proportions
track the weights, rows do not depend on the process count, and a resume (with new weights or not) continues
exactly."""

import json
import uuid

import numpy as np
import pytest

from neobert_jax import errors, paths
from neobert_jax.config import data as data_config
from neobert_jax.config import train as train_config
from neobert_jax.data import mixture, shards
from tests.support import synthetic_data
from neobert_jax.data import pipeline

EXAMPLE = {
  'web': {'dir': 'gs://bucket/web', 'weight': 0.7},
  'books': {'dir': '/data/books', 'weight': [[0, 0.3], [50000, 0.1]]},
}


def _write(tmp_path, body, name='mix.json') -> str:
  path = tmp_path / name
  path.write_text(body if isinstance(body, str) else json.dumps(body))
  return str(path)


def test_the_issue_format_reads_and_normalises_per_step(tmp_path):
  mix = mixture.read(_write(tmp_path, EXAMPLE))
  assert mix.names == ('books', 'web')  # sorted: the file's key order does not change the data
  assert mix.sources[1].dir == 'gs://bucket/web' and mix.sources[0].dir == '/data/books'
  assert mix.weights_at(0) == pytest.approx({'books': 0.3, 'web': 0.7})
  assert mix.weights_at(49999) == pytest.approx({'books': 0.3, 'web': 0.7})
  assert mix.weights_at(50000) == pytest.approx({'books': 0.1 / 0.8, 'web': 0.7 / 0.8})
  for step in (0, 50000):
    assert sum(mix.units_at(step)) == mixture.UNITS
  reordered = mixture.read(_write(tmp_path, dict(reversed(list(EXAMPLE.items()))), 'b.json'))
  assert reordered.sources == mix.sources


def test_each_source_blocks_its_peak_share_of_block_docs_and_a_record_wins(tmp_path):
  mix = mixture.read(_write(tmp_path, EXAMPLE))  # books 0.3 then 0.125; web 0.7 then 0.875
  assert mix.block_docs(512) == {'books': 176, 'web': 512}  # ceil(512 x peak share / the largest)
  recorded = mixture.format_block_docs({'books': 100, 'web': 400})
  assert recorded == 'books=100,web=400'
  assert mix.block_docs(512, recorded) == {'books': 100, 'web': 400}  # a resumed run keeps its blocks
  assert mix.block_docs(512, 'web=400') == {'books': 176, 'web': 400}  # a source new since then gets its share
  assert mix.block_docs(2) == {'books': 1, 'web': 2}
  # Small sources: all shrink together until no first block reads more than a quarter of its virtual shard.
  small = mix.block_docs(512, '', {'books': 1000, 'web': 400})  # web's quarter: 100 documents
  assert small == {'books': 35, 'web': 100} and small['books'] / small['web'] == pytest.approx(0.3 / 0.875, abs=0.01)
  with pytest.raises(ValueError, match='data.mixture_block_docs'):
    mixture.parse_block_docs('books=0')


def test_a_relative_dir_is_relative_to_the_mixture_file(tmp_path):
  (tmp_path / 'recipes').mkdir()
  mix = mixture.read(_write(tmp_path / 'recipes', {'a': {'dir': '../data/a', 'weight': 1}}))
  assert mix.sources[0].dir == f'{tmp_path}/data/a'


def test_a_source_joins_at_its_first_start_step(tmp_path):
  mix = mixture.read(_write(tmp_path, {'a': {'dir': 'a', 'weight': 1}, 'b': {'dir': 'b', 'weight': [[10, 1]]}}))
  assert mix.weights_at(9) == {'a': 1.0, 'b': 0.0}
  assert mix.weights_at(10) == {'a': 0.5, 'b': 0.5}


@pytest.mark.parametrize(
  'body, words',
  [
    ('{"a": {"dir": "x", "weight": 1, "wieght": 2}}', ["source 'a'", "unknown key 'wieght'", "['dir', 'weight']"]),
    ('{"a": {"dir": "x", "weight": 1}, "a": {"dir": "y", "weight": 1}}', ["source name 'a' is used twice"]),
    ('{"a": {"dir": "x", "weight": 1, "weight": 2}}', ["source 'a'", "key 'weight' is given twice"]),
    ('{"a": {"dir": "x", "weight": -0.5}}', ["source 'a'", 'weight -0.5 at step 0 is negative']),
    ('{"a": {"dir": "x", "weight": [[0, 1], [5, -1]]}}', ["source 'a'", 'weight -1 at step 5 is negative']),
    ('{"a": {"dir": "x", "weight": 0}, "b": {"dir": "y", "weight": 0}}', ['every weight is 0 from step 0 on']),
    (
      '{"a": {"dir": "x", "weight": [[0, 1], [100, 0]]}, "b": {"dir": "y", "weight": [[0, 1], [50, 0], [200, 1]]}}',
      ['every weight is 0 from step 100 to step 199'],
    ),
    ('{"a": {"dir": "x", "weight": [[100, 1], [0, 2]]}}', ["source 'a'", 'not sorted by step (100 then 0)']),
    ('{"a": {"dir": "x", "weight": [[0, 1], [0, 2]]}}', ["source 'a'", 'not sorted by step (0 then 0)']),
    ('{"a": {"dir": "x", "weight": [[0.5, 1]]}}', ["source 'a'", 'must be [start_step >= 0, weight]']),
    ('{"a": {"dir": "x", "weight": "high"}}', ["source 'a'", 'must be a number or a schedule']),
    ('{"a": {"dir": "x", "weight": true}}', ["source 'a'", 'must be a number or a schedule']),
    ('{"a": {"weight": 1}}', ["source 'a' has no 'dir'"]),
    ('{"a": {"dir": "", "weight": 1}}', ["source 'a'", 'must be a prepared directory']),
    ('{"a/b": {"dir": "x", "weight": 1}}', ["source name 'a/b'", 'letters, digits']),
    ('[["a", 1]]', ['a mixture is a JSON object of sources']),
    ('{}', ['a mixture is a JSON object of sources']),
    ('{"a": ', ['not valid JSON']),
  ],
)
def test_each_refusal_is_one_config_error_line_naming_the_source(tmp_path, body, words):
  path = _write(tmp_path, body)
  with pytest.raises(errors.ConfigError) as e:
    mixture.read(path)
  message = str(e.value)
  assert '\n' not in message and message.startswith(('data.mixture=', str(tmp_path))), message
  for w in words:
    assert w in message, message


def test_a_missing_mixture_file_is_one_line(tmp_path):
  with pytest.raises(errors.ConfigError, match=r'data.mixture=.*nope.json: no such file'):
    mixture.read(str(tmp_path / 'nope.json'))


def test_the_config_field_and_its_checks():
  cfg = train_config.get_config()
  assert cfg.data.mixture == ''
  cfg.data.mixture, cfg.data.dir = 'mix.json', 'data/web'
  with pytest.raises(errors.ConfigError, match='data.mixture=mix.json and data.dir=data/web are both set'):
    train_config.validate_train(cfg, num_devices=1, process_count=1)
  d = data_config.default_data_config()
  d.mixture = 'mix.yaml'
  with pytest.raises(ValueError, match=r'data.mixture=mix.yaml: expected a .json file'):
    data_config.validate_data_config(d)


# --- The sources' prepared data ----------------------------------------------------------------------------------

SEQ = 64


def _prepared(directory, seed=0, **kw) -> str:
  docs = synthetic_data.synthetic_documents(40, seed=seed, max_len=50, vocab_size=kw.get('vocab_size', 1000))
  synthetic_data.write_prepared(str(directory), docs, docs[:4], **{'vocab_size': 1000, 'max_length': SEQ, **kw})
  return str(directory)


def _opener(model_vocab_size=1000):
  def open_one(directory):
    cfg = data_config.default_data_config()
    cfg.dir = directory
    return pipeline.open_prepared(cfg, SEQ, model_vocab_size)

  return open_one


def _mix(tmp_path, dirs: dict) -> mixture.Mixture:
  return mixture.read(_write(tmp_path, {n: {'dir': d, 'weight': 1} for n, d in dirs.items()}))


def test_sources_that_agree_open_with_their_manifests(tmp_path):
  a, b = _prepared(tmp_path / 'a'), _prepared(tmp_path / 'b', seed=1)
  opened = mixture.open_sources(_mix(tmp_path, {'a': a, 'b': b}), _opener(), SEQ)
  assert list(opened) == ['a', 'b'] and opened['b'][0] == b
  assert opened['a'][1].split('train')['documents'] == 40


def _identity(vocab_size=1000, sha='other'):
  return {
    'kind': 'synthetic',
    'spec': f'synthetic-{sha}',
    'vocab_size': vocab_size,
    'special_ids': dict(synthetic_data.SPECIAL),
    'vocab_sha256': sha,
    'file_sha256': sha,
  }


@pytest.mark.parametrize(
  'make_b, model_vocab, words',
  [
    (lambda d: str(d / 'never'), 1000, ["source 'b'", 'does not exist', 'neobert_jax.data.prepare']),
    (lambda d: (d / 'empty').mkdir() or str(d / 'empty'), 1000, ["source 'b'", 'no manifest.json']),
    (lambda d: _prepared(d / 'b', tokenizer_identity=_identity()), 1000, ["source 'b'", "source 'a'", 'tokenizer']),
    (lambda d: _prepared(d / 'b', max_length=128), 1000, ["source 'b'", '--max-length 128', "source 'a' with 64"]),
    (lambda d: _prepared(d / 'b'), 2000, ["source 'a'", 'vocab_size=2000']),
  ],
  ids=['missing', 'unprepared', 'tokenizer', 'seq-length', 'model-vocab'],
)
def test_a_source_that_does_not_fit_is_one_line_naming_it(tmp_path, make_b, model_vocab, words):
  mix = _mix(tmp_path, {'a': _prepared(tmp_path / 'a'), 'b': make_b(tmp_path)})
  with pytest.raises(errors.ConfigError) as e:
    mixture.open_sources(mix, _opener(model_vocab), SEQ)
  assert '\n' not in str(e.value)
  for w in words:
    assert w in str(e.value), str(e.value)


def test_sources_longer_than_the_model_are_refused(tmp_path):
  mix = _mix(tmp_path, {'a': _prepared(tmp_path / 'a', max_length=128), 'b': _prepared(tmp_path / 'b', max_length=128)})
  with pytest.raises(errors.ConfigError, match="source 'a' was prepared with --max-length 128, longer than the model"):
    mixture.open_sources(mix, _opener(), SEQ)


# --- Sampling ------------------------------------------------------------------------------------------------------


def _three(tmp_path, **weights) -> mixture.Mixture:
  weights = weights or {'a': 0.5, 'b': 0.3, 'c': 0.2}
  return mixture.read(_write(tmp_path, {n: {'dir': n, 'weight': w} for n, w in weights.items()}))


def _run(sampler, steps) -> list[dict]:
  return [sampler.next() for _ in range(steps)]


def test_every_slot_tracks_the_weights_to_within_a_row(tmp_path):
  mix = _three(tmp_path)
  rows, slots, steps = 6, range(8), 300
  s = mixture.Sampler(mix, seed=0, rows_per_slot=rows, slots=slots)
  taken = {v: np.zeros(3, np.int64) for v in slots}  # rows each source gave, per slot
  for k in range(1, steps + 1):
    step = s.next()
    assert all(len(r) == rows for r in step.values())
    for v in slots:
      taken[v] += np.bincount(step[v], minlength=3)
      for i, (n, w) in enumerate(mix.weights_at(0).items()):
        assert abs(taken[v][i] - w * rows * k) <= 1.0 + 1e-9, (k, v, n)
  # The whole batch, per step: slots round in different steps, so each step is near its share too.
  counts = np.array([[np.bincount(np.concatenate(list(step.values())), minlength=3) for step in _run(s, 50)]])[0]
  assert np.abs(counts - np.array([0.5, 0.3, 0.2]) * rows * len(slots)).max() <= 3


def test_a_zero_weight_source_gets_no_rows_and_a_schedule_applies_from_its_step(tmp_path):
  mix = mixture.read(_write(tmp_path, {'a': {'dir': 'a', 'weight': 1}, 'b': {'dir': 'b', 'weight': [[0, 0], [20, 3]]}}))
  s = mixture.Sampler(mix, seed=3, rows_per_slot=8, slots=[0, 1])
  for step in _run(s, 20):
    assert all((r == 0).all() for r in step.values())
  later = np.concatenate([np.concatenate(list(step.values())) for step in _run(s, 100)])
  assert abs((later == 1).mean() - 0.75) < 0.01


def test_rows_do_not_depend_on_the_process_count(tmp_path):
  mix = _three(tmp_path)
  whole = _run(mixture.Sampler(mix, seed=7, rows_per_slot=4, slots=range(8)), 40)
  for n in (2, 4):
    parts = [
      _run(mixture.Sampler(mix, seed=7, rows_per_slot=4, slots=range(p * 8 // n, (p + 1) * 8 // n)), 40)
      for p in range(n)
    ]
    for k in range(40):
      joined = {v: r for part in parts for v, r in part[k].items()}
      assert all(np.array_equal(joined[v], whole[k][v]) for v in range(8))


def test_the_seed_decides_the_rows(tmp_path):
  mix = _three(tmp_path)
  a, b, c = (_run(mixture.Sampler(mix, seed=s, rows_per_slot=5, slots=range(4)), 20) for s in (1, 1, 2))
  same = lambda x, y: all(np.array_equal(p[v], q[v]) for p, q in zip(x, y) for v in range(4))  # noqa: E731
  assert same(a, b) and not same(a, c)


def test_a_resume_continues_exactly_even_on_another_process_count(tmp_path):
  mix = _three(tmp_path)
  whole = mixture.Sampler(mix, seed=0, rows_per_slot=4, slots=range(8))
  _run(whole, 30)
  rest = _run(whole, 30)
  halves = [mixture.Sampler(mix, seed=0, rows_per_slot=4, slots=range(p * 4, p * 4 + 4)) for p in range(2)]
  for h in halves:
    _run(h, 30)
  state = json.loads(json.dumps(pipeline.merge_states([h.get_state() for h in halves])))  # as a checkpoint holds it
  for slot in state['slots'].values():  # a checkpoint of an older sampler also counted each source's rows: unread
    slot['taken'] = dict.fromkeys(mix.names, 0)
  resumed = mixture.Sampler(mix, seed=0, rows_per_slot=4, slots=range(8))
  resumed.set_state(state)
  assert resumed.step == 30
  again = _run(resumed, 30)
  assert all(np.array_equal(x[v], y[v]) for x, y in zip(rest, again) for v in range(8))


def test_new_weights_on_resume_apply_from_the_resume_step(tmp_path):
  old = _three(tmp_path)
  s = mixture.Sampler(old, seed=0, rows_per_slot=10, slots=range(4))
  _run(s, 50)
  new = _three(tmp_path, a=0.1, b=0.1, c=0.8)
  resumed = mixture.Sampler(new, seed=0, rows_per_slot=10, slots=range(4))
  resumed.set_state(s.get_state())
  since = np.bincount(np.concatenate([r for step in _run(resumed, 50) for r in step.values()]), minlength=3)
  for i, (n, w) in enumerate(new.weights_at(0).items()):
    assert abs(since[i] - w * 10 * 4 * 50) <= 4, n


def test_a_changed_source_set_is_refused_unless_started_fresh(tmp_path):
  s = mixture.Sampler(_three(tmp_path), seed=0, rows_per_slot=4, slots=range(2))
  _run(s, 5)
  state = s.get_state()
  grown = mixture.Sampler(_three(tmp_path, a=1, b=1, c=1, d=1), seed=0, rows_per_slot=4, slots=range(2))
  with pytest.raises(errors.ConfigError, match="source 'd' is new since the checkpoint"):
    grown.set_state(state)
  grown.set_state(state, fresh=['d'])
  fresh_d = mixture.starting_credits(0, 0, grown.mix.names)['d']
  assert grown.step == 5 and grown.credits[0]['d'] == fresh_d and grown.credits[0]['a'] == s.credits[0]['a']
  shrunk = mixture.Sampler(_three(tmp_path, a=1, b=1), seed=0, rows_per_slot=4, slots=range(2))
  with pytest.raises(errors.ConfigError, match="source 'c' is gone since the checkpoint"):
    shrunk.set_state(state, fresh=['c'])
  moved = {n: {'dir': f'{n}2' if n == 'b' else n, 'weight': 1} for n in 'abc'}
  elsewhere = mixture.Sampler(mixture.read(_write(tmp_path, moved, 'moved.json')), 0, 4, range(2))
  with pytest.raises(errors.ConfigError, match=f"source 'b' points to {tmp_path}/b2, not {tmp_path}/b since"):
    elsewhere.set_state(state)
  elsewhere.set_state(state, fresh=['b'])
  fresh_b = mixture.starting_credits(0, 1, elsewhere.mix.names)['b']
  assert elsewhere.credits[1]['b'] == fresh_b and elsewhere.credits[1]['c'] == s.credits[1]['c']


def test_interleave_spreads_each_source_over_the_slot():
  # Each half of the slot (a micro-batch) holds about half of each source's rows.
  assert mixture.interleave([6, 3, 0, 3]).tolist() == [0, 1, 3, 0, 0, 1, 3, 0, 0, 1, 3, 0]
  assert mixture.interleave([0, 0]).size == 0


@pytest.mark.server
def test_a_mixture_on_a_bucket_names_its_sources_relative_to_itself(tmp_path, gcs):
  root = f'{gcs}/{uuid.uuid4().hex[:8]}'
  paths.publish_dir(_prepared(tmp_path / 'web'), paths.resolve(f'{root}/data/web'), shards.MANIFEST)
  body = {'web': {'dir': 'data/web', 'weight': 1}, 'gone': {'dir': f'{root}/data/gone', 'weight': 1}}
  paths.resolve(f'{root}/mix.json').write_text(json.dumps(body))
  mix = mixture.read(f'{root}/mix.json')
  assert dict(zip(mix.names, (s.dir for s in mix.sources))) == {'gone': f'{root}/data/gone', 'web': f'{root}/data/web'}
  with pytest.raises(errors.ConfigError, match=f"{root}/mix.json: source 'gone': .*{root}/data/gone"):
    mixture.open_sources(mix, _opener(), SEQ)
  body.pop('gone')
  paths.resolve(f'{root}/mix.json').write_text(json.dumps(body))
  opened = mixture.open_sources(mixture.read(f'{root}/mix.json'), _opener(), SEQ)
  assert opened['web'][1].split('train')['documents'] == 40
