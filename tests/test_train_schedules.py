"""What a run logs: the learning rate of a WSD run with a 1-sqrt decay to zero, read back from metrics.jsonl at its
plateau, mid-decay and end, equals the formula; with logging.wandb, an offline Weights & Biases run
(WANDB_MODE=offline: no network) holds every metric metrics.jsonl holds (what TensorBoard gets), under the
project, name and tags of the config. The offline run file is read back record by record (a LevelDB-style log of
wandb's protobuf Records)."""

import importlib.util
import logging
import json
import struct

import numpy as np
import pytest

from neobert_jax import errors
from tests.support.tiny_train import REPO_ROOT as REPO, tiny_config, train_only

STEPS, WARMUP, DECAYING, PEAK = 10, 2, 4, 2e-3  # updates 6..9 decay; metrics.jsonl logs update t as step t + 1
WANDB = importlib.util.find_spec('wandb') is not None  # the [wandb] extra, part of [test]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('wsd')
  cfg = tiny_config(steps=STEPS)
  o = cfg.optimizer
  o.schedule, o.decay_shape, o.wsd_decay_fraction, o.final_lr_fraction = 'wsd', '1-sqrt', DECAYING / STEPS, 0.0
  o.peak_lr, o.warmup_steps = PEAK, WARMUP
  cfg.eval.every_steps, cfg.eval.num_batches = 5, 1
  cfg.logging.update(wandb=WANDB, wandb_project='stages', wandb_run_name='tiny', wandb_tags='stage1, test')
  with pytest.MonkeyPatch.context() as env:
    env.setenv('WANDB_MODE', 'offline')
    env.setenv('WANDB_SILENT', 'true')
    assert train_only(cfg, workdir).final_step == STEPS
  return workdir


def _formula(logged_step: int) -> float:
  """WSD by the book, on the logged step s (updates done): linear warmup, the peak, then 1 - sqrt(progress) over
  the last DECAYING steps, reaching 0 at s = STEPS."""
  t = logged_step - 1  # the update that step logged
  if t < WARMUP:
    return PEAK * t / WARMUP
  progress = max(logged_step - (STEPS - DECAYING), 0) / DECAYING
  return PEAK * (1.0 - np.sqrt(progress))


def _written(workdir):
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_logged_learning_rate_of_a_wsd_1_sqrt_run_is_the_formula(run):
  lr = {row['step']: row['train/learning_rate'] for row in _written(run) if 'train/learning_rate' in row}
  assert sorted(lr) == list(range(1, STEPS + 1))
  for step in lr:
    assert lr[step] == np.float32(_formula(step)), step
  plateau, mid, end = lr[5], lr[8], lr[STEPS]
  assert plateau == np.float32(PEAK)
  assert mid == np.float32(PEAK * (1 - np.sqrt(0.5))) and 0 < mid < PEAK
  assert end == 0.0


def _records(path):
  """The protobuf Records of a .wandb file: 7-byte file header, then 32 KiB blocks of (crc32, length, type) +
  payload chunks (type 1 whole, 2/3/4 first/middle/last)."""
  from wandb.proto import wandb_internal_pb2 as pb  # pylint: disable=g-import-not-at-top

  data, pos, block, part, out = path.read_bytes(), 7, 32768, b'', []
  while pos + 7 <= len(data):
    left = block - pos % block
    _, length, kind = struct.unpack('<IHB', data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
    if length == 0 and kind == 0:  # the block's zero-filled tail
      pos += left
      continue
    part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
    if kind in (1, 4):
      record = pb.Record()
      record.ParseFromString(part)
      out.append(record)
      part = b''
  return out


@pytest.mark.slow
@pytest.mark.skipif(not WANDB, reason='wandb is not installed (pip install -e .[wandb])')
def test_an_offline_wandb_run_holds_the_same_metrics(run):
  (run_file,) = (run / 'wandb').glob('offline-run-*/run-*.wandb')
  records = _records(run_file)
  (info,) = [r.run for r in records if r.WhichOneof('record_type') == 'run']
  assert (info.project, info.display_name, list(info.tags)) == ('stages', 'tiny', ['stage1', 'test'])
  assert info.run_id == (run / 'wandb' / 'run_id').read_text().strip()  # a resume logs on into this run
  name = lambda item: item.key or '/'.join(item.nested_key)  # keys with a '/' come as nested keys
  logged = [
    {name(i): json.loads(i.value_json) for i in r.history.item if not name(i).startswith('_')}
    for r in records
    if r.WhichOneof('record_type') == 'history'
  ]
  written = _written(run)
  assert {'train/loss', 'train/learning_rate', 'eval/loss', 'eval/accuracy'} <= {k for row in written for k in row}
  for row in written:
    assert row in logged, row


def test_the_250m_recipe_offers_a_linear_decay_to_zero_and_keeps_the_papers_cosine():
  import importlib.util  # pylint: disable=g-import-not-at-top

  from neobert_jax.engine import optimizer  # pylint: disable=g-import-not-at-top
  from tests.support.tiny_train import REPO_ROOT  # pylint: disable=g-import-not-at-top

  spec = importlib.util.spec_from_file_location('_neobert_250m_d2z', REPO_ROOT / 'configs' / 'neobert_250m.py')
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  paper, d2z = recipe.get_config(), recipe.get_config('d2z')
  assert paper.optimizer.schedule == 'cosine' and paper.optimizer.final_lr_fraction == 0.1
  n, warmup, peak = d2z.train.num_steps, d2z.optimizer.warmup_steps, d2z.optimizer.peak_lr
  lr = optimizer.lr_values(d2z.optimizer, n, np.array([warmup, (warmup + n - 1) / 2, n - 1]))
  np.testing.assert_allclose(lr, [peak, peak / 2, 0.0], rtol=1e-5, atol=1e-12)  # the line starts one update in
  assert d2z.to_dict() == {**paper.to_dict(), 'optimizer': d2z.optimizer.to_dict()}


@pytest.mark.parametrize('config_file', sorted(p.name for p in (REPO / 'configs').glob('*.py') if p.stem != '__init__'))
def test_an_explicit_warmup_steps_wins_on_every_shipped_config(config_file, caplog):
  """The one warmup knob: --config.optimizer.warmup_steps=N works whatever the recipe set (a warmup_fraction too),
  says so in the log, and config.json records what ran, which resolves to itself."""
  from neobert_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.config import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  from neobert_jax.config import train as train_config  # pylint: disable=g-import-not-at-top

  cfg = config_lib.load(REPO / 'configs' / config_file, {'optimizer.warmup_steps': 10})
  if 'task' in cfg:
    cfg.data.train_file = 'train.csv'  # required by the schema; not read by validation
  validate = (
    finetune_config.validate_finetune if 'task' in cfg else lambda c: train_config.validate_train(c, num_devices=1)
  )
  had_share = cfg.optimizer.warmup_fraction > 0
  with caplog.at_level(logging.INFO, logger='neobert_jax.config'):
    resolved = validate(cfg)
  assert (resolved.optimizer.warmup_steps, resolved.optimizer.warmup_fraction) == (10, 0.0)
  assert ('warmup_steps=10 wins' in caplog.text) == had_share
  again = validate(resolved)
  assert (again.optimizer.warmup_steps, again.optimizer.warmup_fraction) == (10, 0.0)


def test_the_fine_tuning_warmup_in_steps_replaces_the_share():
  from neobert_jax.engine import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.config import finetune as finetune_config  # pylint: disable=g-import-not-at-top

  cfg = finetune_config.base_config('classification')
  cfg.optimizer.lr, cfg.optimizer.schedule, cfg.data.train_file = 1.0, 'linear', 'train.csv'
  share = optimizer_lib.make_finetune_optimizer(finetune_config.validate_finetune(cfg).optimizer, 100)[1]
  assert float(share(5)) == pytest.approx(0.5)  # warmup_fraction 0.1 of 100 steps: 10 steps
  cfg.optimizer.warmup_steps = 20
  steps = optimizer_lib.make_finetune_optimizer(finetune_config.validate_finetune(cfg).optimizer, 100)[1]
  assert float(steps(5)) == pytest.approx(0.25) and float(steps(20)) == pytest.approx(1.0)


def test_a_warmup_given_as_a_share_of_the_run_follows_its_length():
  from neobert_jax.config import train as train_config  # pylint: disable=g-import-not-at-top

  cfg = train_config.get_config()
  cfg.optimizer.warmup_fraction, cfg.optimizer.schedule, cfg.optimizer.final_lr_fraction = 0.3, 'linear', 0.0
  cfg.optimizer.warmup_steps = 0
  for steps, warmup in ((2000, 600), (40, 12), (2, 1)):
    cfg.train.num_steps = steps
    resolved = train_config.validate_train(cfg, num_devices=1)
    assert resolved.optimizer.warmup_steps == warmup
    assert train_config.validate_train(resolved, num_devices=1).optimizer.warmup_steps == warmup  # config.json re-read
  cfg.optimizer.warmup_fraction = 1.0
  with pytest.raises(errors.ConfigError, match=r'optimizer.warmup_fraction=1.0 must be in \[0, 1\)'):
    train_config.validate_train(cfg, num_devices=1)
