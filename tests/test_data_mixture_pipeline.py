"""A mixture in the pipeline and the trainer: every source read as one source is (its own virtual shards, packing
and position), rows drawn by the sampler (data/mixture.py). Rows hold one source each and follow the weights; the
rows of a step do not depend on the process count; a position saved by any process count restores exactly; a run
trains on a mixture, evaluates each source, resumes bit for bit after a crash, records new weights in
config_history.jsonl and refuses a source added since its checkpoint unless data.mixture_fresh names it."""

import json

import numpy as np
import pytest

from test_train_resume import Crash, _crash_after

from neobert_jax import errors
from neobert_jax.config import data as data_config
from neobert_jax.data import pipeline
from tests.support import synthetic_data
from neobert_jax.data.pipeline import factories, prepared
from neobert_jax.train import baselines, report
from tests.support.tiny_train import assert_identical_params, tiny_config, train_only
from neobert_jax.weights import runs

SEQ, VOCAB, BATCH = 64, 1000, 16
MARK = 900  # the third id of every document names its source: MARK + the source's number


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  d = tmp_path_factory.mktemp('mixture')
  for i, name in enumerate('abc'):
    docs = synthetic_data.synthetic_documents(400, seed=i, min_len=5, max_len=60, vocab_size=VOCAB)
    for doc in docs:
      doc[2] = MARK + i
    synthetic_data.write_prepared(str(d / name), docs[:360], docs[360:], vocab_size=VOCAB, max_length=SEQ)
  return d


def _mixture(root, weights) -> str:
  path = root / f'mix-{abs(hash(json.dumps(weights)))}.json'
  path.write_text(json.dumps({n: {'dir': n, 'weight': w} for n, w in weights.items()}))
  return str(path)


def _config(mixture: str, **kw):
  cfg = data_config.default_data_config()
  cfg.mixture, cfg.block_docs, cfg.virtual_shards = mixture, 64, 4
  for k, v in kw.items():
    cfg[k] = v
  return cfg


def _iterator(cfg, process_index=0, process_count=1, state=None):
  ds, _ = factories.train_batches(cfg, prepared.open_data(cfg, SEQ), BATCH, SEQ, 0, process_index, process_count)
  it = iter(ds)
  if state is not None:
    it.set_state(state)
  return it


def _sources(batch) -> np.ndarray:
  """The source of every document in the batch's rows: [rows, documents] (-1 where a row has fewer)."""
  ids = synthetic_data.original_ids(batch)
  starts = (batch['positions'] == 2) & (batch['segment_ids'] > 0)
  return [sorted(set((ids[r][starts[r]] - MARK).tolist())) for r in range(len(ids))]


def test_rows_hold_one_source_each_and_follow_the_weights(root):
  it = _iterator(_config(_mixture(root, {'a': 0.5, 'b': 0.3, 'c': 0.2})))
  counts = np.zeros(3)
  for _ in range(30):
    batch = next(it)
    sources = _sources(batch)
    assert all(len(s) == 1 for s in sources)  # packing is per source
    counts += np.bincount([s[0] for s in sources], minlength=3)
  assert np.abs(counts / counts.sum() - [0.5, 0.3, 0.2]).max() < 0.01


def test_rows_do_not_depend_on_the_process_count_and_any_position_restores(root):
  cfg = _config(_mixture(root, {'a': 1, 'b': [[0, 1], [5, 3]]}))
  one = _iterator(cfg)
  whole = [next(one) for _ in range(12)]
  halves = [_iterator(cfg, p, 2) for p in range(2)]
  for k in range(6):
    parts = [next(h) for h in halves]
    assert all(np.array_equal(np.concatenate([p[key] for p in parts]), whole[k][key]) for key in whole[k])
  state = pipeline.merge_states([json.loads(json.dumps(h.get_state())) for h in halves])
  resumed = _iterator(cfg, state=state)
  for k in range(6, 12):
    assert np.array_equal(next(resumed)['input_ids'], whole[k]['input_ids'])


def test_prefetch_workers_or_an_unknown_fresh_source_are_one_line(root):
  with pytest.raises(errors.ConfigError, match='set data.num_workers=0 with data.mixture'):
    _iterator(_config(_mixture(root, {'a': 1}), num_workers=2))
  with pytest.raises(errors.ConfigError, match=r"data.mixture_fresh names 'z', not a source of .*\(\['a'\]\)"):
    _iterator(_config(_mixture(root, {'a': 1}), mixture_fresh='a, z'))


def _train_config(mixture, steps=6):
  cfg = tiny_config(vocab_size=VOCAB, seq_len=SEQ, steps=steps)
  cfg.data.mixture, cfg.data.block_docs, cfg.eval.every_steps = mixture, 64, 3
  return cfg


@pytest.mark.slow
def test_a_run_on_a_mixture_evaluates_each_source_and_resumes_bit_for_bit(root, tmp_path):
  mixture = _mixture(root, {'a': 0.7, 'b': [[0, 0.3], [4, 0.6]]})
  full = train_only(_train_config(mixture), tmp_path / 'full')
  last = full.evals[-1]
  weights = {'a': 0.7 / 1.3, 'b': 0.6 / 1.3}  # at step 6
  assert last['loss'] == pytest.approx(sum(w * last[f'{n}/loss'] for n, w in weights.items()))
  lines = [json.loads(x) for x in (tmp_path / 'full' / 'metrics.jsonl').read_text().splitlines()]
  assert {'eval/a/loss', 'eval/a/accuracy', 'eval/b/loss', 'eval/b/accuracy', 'eval/loss'} <= set(lines[-1])
  curve = runs.loss_curve(tmp_path / 'full')[-1]  # loss_curve.md's rows: a column per source
  assert curve['a/loss'] == last['a/loss'] and curve['b/loss'] == last['b/loss'] and 'loss' not in curve
  with pytest.raises(Crash):
    train_only(_train_config(mixture), tmp_path / 'part', on_step=_crash_after(4))
  assert runs.latest_step(tmp_path / 'part') == 3
  train_only(_train_config(mixture), tmp_path / 'part')
  assert_identical_params(runs.restore_params(tmp_path / 'part')[1], runs.restore_params(tmp_path / 'full')[1])


@pytest.mark.slow
def test_new_weights_on_resume_are_recorded_and_a_new_source_needs_mixture_fresh(root, tmp_path):
  train_only(_train_config(_mixture(root, {'a': 0.7, 'b': 0.3}), steps=3), tmp_path)
  train_only(_train_config(_mixture(root, {'a': 0.2, 'b': 0.8}), steps=5), tmp_path)
  resume = json.loads((tmp_path / 'config_history.jsonl').read_text().splitlines()[-1])
  change = next(c for c in resume['changes'] if c['field'] == 'data.mixture_sources')
  assert change['kind'] == 'schedule' and '0.8' in change['after'] and '0.3' in change['before']
  recorded = json.loads((tmp_path / 'config.json').read_text())['data']['mixture_block_docs']
  assert recorded == 'a=12,b=5'  # the first start's (a quarter of a's virtual shard; b at 0.3 / 0.7 of it), kept
  grown = _train_config(_mixture(root, {'a': 0.2, 'b': 0.8, 'c': 1}), steps=6)
  with pytest.raises(errors.ConfigError, match="source 'c' is new since the checkpoint"):
    train_only(grown, tmp_path)
  grown.data.mixture_fresh = 'c'
  assert train_only(grown, tmp_path).final_step == 6


def test_a_source_that_runs_out_starts_its_next_epoch_and_the_log_says_so(root, caplog):
  it = _iterator(_config(_mixture(root, {'a': 0.9, 'b': 0.1}), block_docs=16))
  with caplog.at_level('INFO', logger='neobert_jax.data'):
    for _ in range(40):
      next(it)
  said = [r.getMessage() for r in caplog.records if 'starts epoch' in r.getMessage()]
  assert said and said[0] == "mixture source 'a' starts epoch 2 (its documents again, reshuffled)"


def test_the_report_gives_each_source_its_own_baselines_next_to_its_loss(root, tmp_path, caplog):
  from neobert_jax.config import train as train_config

  cfg = _train_config(_mixture(root, {'a': 0.7, 'b': 0.3}))
  rate = train_config.eval_mask_rate(cfg)
  per = baselines.source_baselines(cfg.data, SEQ, rate, 'auto')
  assert sorted(per) == ['a', 'b']
  for n in 'ab':  # each source's bars are those of that source read alone, from its own held-out split
    assert per[n] == baselines.context_baselines(data_config.source_config(cfg.data, str(root / n)), SEQ, rate)
  assert per['a']['held_out'] != per['b']['held_out']
  evals = [{'step': 6, 'loss': 5.0, 'accuracy': 0.1, 'a/loss': 4.0, 'b/loss': 6.0}]
  with caplog.at_level('INFO', logger='neobert_jax.train'):
    out = report.report(cfg, tmp_path, evals)
  assert out['baselines_per_source']['b']['unigram']['held_out'] == per['b']['held_out']
  assert out['baselines_per_source']['a']['neighbours'] == per['a']['neighbours']
  said = f"source 'b': held-out MLM loss 6.000 against its own baselines: unigram {per['b']['held_out']:.3f}"
  assert said in caplog.text, caplog.text
