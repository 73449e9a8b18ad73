"""Resume with a changed config: identity changes are refused with nothing touched, schedule and free changes are
accepted, logged and recorded, and a checkpoint that does not fit is a config mismatch, never 'corrupt'."""

import json
import shutil

import numpy as np
import pytest

from neobert_jax.config import train as schema
from neobert_jax import errors
from neobert_jax.config import resume as rules
from tests.support.tiny_train import finished_tiny_run, train_only
from neobert_jax.engine import optimizer as optimizer_lib
from tests.support.tiny_train import files_of, run_history as history, tiny_config


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  """A finished 6-step run (checkpoints at 3 and 6), copied by each test."""
  workdir = tmp_path_factory.mktemp('run')
  assert finished_tiny_run(workdir, steps=6) == 6
  return workdir


@pytest.fixture
def run(finished, tmp_path):
  shutil.copytree(finished, tmp_path / 'run')
  return tmp_path / 'run'


def test_every_schema_field_has_a_rule_and_the_issue_s_identity_fields_are_identity():
  fields = rules.flat(schema.get_config().to_dict())
  kinds = {f: rules.rule(f, rules.PRETRAIN_RULES) for f in fields}
  # Every section is named in the table: a field added to the schema falls under a deliberate rule.
  assert {f.split('.')[0] for f in fields} <= set(rules.PRETRAIN_RULES)
  for field in (
    'seed',
    'model.hidden_size',
    'model.num_layers',
    'model.vocab_size',
    'model.max_length',
    'model.param_dtype',
    'model.scan_layers',
    'data.tokenizer',
    'data.dir',
    'data.packing',
    'data.mask_rate',
    'data.mask_strategy',
    'data.max_predictions',
    'data.shuffle_seed',
    'model.rope_theta',
    'optimizer.schedule',
    'train.batch_warmup_tokens',
    'train.batch_warmup_start',
    'train.ema_decay',
  ):
    assert kinds[field] == rules.IDENTITY, field
  for field in (
    'train.num_steps',
    'train.global_batch_size',
    'train.grad_accum_steps',
    'optimizer.peak_lr',
    'optimizer.warmup_steps',
    'optimizer.wsd_decay_fraction',
    'optimizer.decay_shape',
  ):
    assert kinds[field] == rules.SCHEDULE, field
  for field in (
    'logging.log_every',
    'eval.every_steps',
    'checkpoint.every_steps',
    'logging.progress_bar',
    'model.attention_impl',
    'model.remat_policy',
    'mesh.fsdp',
    'export.hf_dir',
    'export.use_ema',
    'init.keep_optimizer',
    'init.continue_data',
    'logging.wandb',
  ):
    assert kinds[field] == rules.FREE, field


@pytest.mark.slow
def test_identity_change_is_refused_with_both_values_and_nothing_touched(run, capsys):
  before = files_of(run)
  cfg = tiny_config(steps=6)
  cfg.model.hidden_size, cfg.data.mask_rate = 64, 0.3
  with pytest.raises(SystemExit) as stop, errors.reported('train'):
    train_only(cfg, run)
  assert stop.value.code == errors.ConfigError.exit_status
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(err) == 1, err
  for needle in (
    'model.hidden_size 32 -> 64',
    'data.mask_rate 0.2 -> 0.3',
    'checkpoint step 6',
    'new --workdir',
    f'--config.init.from_checkpoint={run}',
  ):
    assert needle in err[0], err[0]
  assert files_of(run) == before  # nothing renamed, rewritten or added
  assert not list((run / 'checkpoints').glob('*.corrupt*'))


def test_num_steps_below_the_checkpoint_is_refused(run):
  before = files_of(run)
  with pytest.raises(errors.ConfigError, match='below the checkpoint step 6'):
    train_only(tiny_config(steps=4), run)
  assert files_of(run) == before


@pytest.mark.slow
def test_extending_the_run_follows_the_new_schedule_and_is_recorded(run, caplog):
  cfg = tiny_config(steps=9)
  cfg.checkpoint.every_steps = 2  # a free change alongside the schedule one
  caplog.set_level('WARNING')
  assert train_only(cfg, run).final_step == 9
  assert 'train.num_steps 6 -> 9 (schedule)' in caplog.text
  assert 'the next update (step 6) uses' in caplog.text
  # The updates after the resume use the new 9-step schedule, rounded as the optimizer rounds it.
  lines = [json.loads(x) for x in (run / 'metrics.jsonl').read_text().splitlines()]
  lr = {row['step']: row['train/learning_rate'] for row in lines if 'train/learning_rate' in row}
  expected = optimizer_lib.lr_values(cfg.optimizer, 9, np.arange(6, 9)).astype(np.float32)
  np.testing.assert_array_equal([lr[s] for s in (7, 8, 9)], expected)
  events = history(run)
  assert [e['event'] for e in events] == ['start', 'resume'] and events[1]['step'] == 6
  assert {(c['field'], c['before'], c['after'], c['kind']) for c in events[1]['changes']} == {
    ('train.num_steps', 6, 9, 'schedule'),
    ('checkpoint.every_steps', 3, 2, 'free'),
  }
  assert json.loads((run / 'config.json').read_text())['train']['num_steps'] == 9


def test_free_changes_on_a_finished_run_are_logged_and_recorded(run, caplog):
  cfg = tiny_config(steps=6)
  cfg.logging.log_every, cfg.model.attention_impl = 3, 'blockwise'
  caplog.set_level('WARNING')
  assert train_only(cfg, run).final_step == 6
  assert 'logging.log_every 1 -> 3 (free)' in caplog.text
  assert {c['field'] for c in history(run)[-1]['changes']} == {'logging.log_every', 'model.attention_impl'}


def _record_tokenizer(workdir, spec):
  """Rewrites every copy of the run's recorded config (config.json, each step's config item) with data.tokenizer =
  spec: '' is a run recorded before the trainer resolved its tokenizer."""
  for path in [workdir / 'config.json', *(workdir / 'checkpoints').glob('*/config/metadata')]:
    recorded = json.loads(path.read_text())
    recorded['data']['tokenizer'] = spec
    path.write_text(json.dumps(recorded))


def test_the_run_records_its_tokenizer_and_a_resume_that_leaves_it_unset_continues(run):
  """A fresh run with data.tokenizer unset records the one its data was prepared with in config.json. Resuming
  with data.tokenizer unset continues with it, and so does a run recorded before the tokenizer was (unset in every
  copy of its config): neither is a changed config. Another tokenizer is an identity change."""
  tokenizer = lambda: json.loads((run / 'config.json').read_text())['data']['tokenizer']
  assert tokenizer() == 'bert-base-uncased'  # tiny_config leaves it unset: the built-in corpus's
  # The same command again (the run is finished: it only restores), then an older run extended by a step.
  for steps, recorded, changed in ((6, 'bert-base-uncased', []), (7, '', ['train.num_steps'])):
    _record_tokenizer(run, recorded)
    cfg = tiny_config(steps=steps)
    assert cfg.data.tokenizer == ''
    assert train_only(cfg, run).final_step == steps
    assert [c['field'] for c in history(run)[-1]['changes']] == changed
    assert tokenizer() == 'bert-base-uncased'
  assert rules.diff({'data': {'tokenizer': ''}}, {'data': {'tokenizer': 'x'}}, rules.PRETRAIN_RULES) == []
  cfg = tiny_config(steps=7)
  cfg.data.tokenizer = 'builtin-wordpiece-2048'
  with pytest.raises(errors.ConfigError, match="data.tokenizer 'bert-base-uncased' -> 'builtin-wordpiece-2048'"):
    train_only(cfg, run)


def test_switching_clipping_off_is_refused_before_the_restore(run):
  cfg = tiny_config(steps=6)
  cfg.optimizer.clip_norm = 0.0
  with pytest.raises(errors.ConfigError, match=r'optimizer.clip_norm 1.0 -> 0.0'):
    train_only(cfg, run)


def test_a_checkpoint_that_does_not_fit_is_a_mismatch_never_corrupt(run):
  """Without a recorded config to compare (a run from before configs were saved), the arrays themselves are
  checked against the state the config builds: a mismatch is one config error and nothing is set aside."""
  for item in (run / 'checkpoints').glob('*/config'):
    shutil.rmtree(item)
  (run / 'config.json').unlink()
  before = files_of(run)
  cfg = tiny_config(steps=6)
  cfg.model.hidden_size = 64
  with pytest.raises(errors.ConfigError, match=r'expected shape \(64,\), got \(32,\)'):
    train_only(cfg, run)
  assert files_of(run) == before
  assert not list((run / 'checkpoints').glob('*.corrupt*'))


def test_workdir_that_is_a_file_and_missing_init_sources_are_one_line(tmp_path):
  (tmp_path / 'afile').write_text('x')
  with pytest.raises(errors.ConfigError, match='is a file, not a directory'):
    train_only(tiny_config(steps=2), tmp_path / 'afile')
  for field in ('from_checkpoint', 'from_hf'):
    cfg = tiny_config(steps=2)
    cfg.init[field] = str(tmp_path / 'no' / 'such')
    with pytest.raises(errors.CheckpointError, match=f'init.{field}='):
      train_only(cfg, tmp_path / f'w_{field}')
    assert not (tmp_path / f'w_{field}').exists()


@pytest.mark.parametrize(
  'field,value,needle',
  [
    ('optimizer.peak_lr', -1.0, 'optimizer.peak_lr=-1.0 must be > 0'),
    ('optimizer.warmup_steps', 10, 'longer than the run'),
    ('optimizer.final_lr_fraction', 2.0, 'may not exceed the peak'),
    ('optimizer.b2', 1.0, 'optimizer.b2=1.0 must be in [0, 1)'),
    ('data.mask_rate', 0.0, 'data.mask_rate must be in (0, 1)'),
    ('eval.num_batches', 0, 'eval.num_batches=0'),
  ],
)
def test_values_that_cannot_train_are_refused_before_anything_runs(tmp_path, field, value, needle):
  cfg = tiny_config(steps=6)
  section, name = field.split('.')
  cfg[section][name] = value
  with pytest.raises(errors.ConfigError) as e:
    train_only(cfg, tmp_path / 'w')
  assert needle in str(e.value)
  assert not (tmp_path / 'w').exists()
