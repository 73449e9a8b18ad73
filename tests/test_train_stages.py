"""The three-stage recipe (configs/tiny_cpu_stages.py, the tiny size of configs/neobert_250m_stages.py) end to end
at three steps a stage: a batch ramp, context extension with RoPE theta 160k, a lower mask rate and a 1-sqrt decay,
the optimizer's moments and the data position carried over, each stage's origin in its history; and a resume of a
stage that tries to change theta, refused with one line."""

import json

import jax
import orbax.checkpoint as ocp
import pytest

from neobert_jax import config, errors
from neobert_jax.data import pipeline
from tests.support.tiny_train import REPO_ROOT, train_only, run_history

STEPS = 3


def _stage(n, previous=None):
  cfg = config.load(f'{REPO_ROOT}/configs/tiny_cpu_stages.py:{n}')
  cfg.train.num_steps, cfg.eval.every_steps = STEPS, 0
  cfg.eval.probe_task = ''  # tiny_cpu's downstream probe is the main job's (tests/test_train_probe.py)
  cfg.checkpoint.every_steps, cfg.checkpoint.async_save = STEPS, False
  cfg.logging.update(log_every=1, progress_bar=False, tensorboard=False, peak_flops_per_device=1e11)
  if n != '3':
    cfg.optimizer.warmup_steps = 2  # warmups scaled to the three steps
  if n == '1':
    cfg.train.batch_warmup_tokens = 2 * 16 * 128  # 16 sequences for 2 steps, then 32
  else:
    cfg.init.from_checkpoint = str(previous)
  return cfg


@pytest.fixture(scope='module')
def stages(tmp_path_factory):
  root = tmp_path_factory.mktemp('stages')
  for n in '123':
    assert train_only(_stage(n, root / str(int(n) - 1)), root / n).final_step == STEPS
  return root


def _metrics(workdir):
  return {
    r['step']: r for r in map(json.loads, (workdir / 'metrics.jsonl').read_text().splitlines()) if 'train/loss' in r
  }


def _opt(workdir):
  """(the stage's step, the moments' update count): the largest 'count' in the optimizer state, whichever optimizer
  (the recipe trains with Muon, whose state nests AdamW's); the schedules' counters restart with each stage."""
  with ocp.StandardCheckpointer() as reader:
    tree = reader.restore(workdir / 'checkpoints' / str(STEPS) / 'opt')
  leaves = jax.tree_util.tree_flatten_with_path(tree['opt_state'])[0]
  counts = [int(leaf) for path, leaf in leaves if any(getattr(k, 'key', None) == 'count' for k in path)]
  return int(tree['step']['value']), max(counts)


@pytest.mark.slow
def test_three_stages_change_what_they_say_and_record_where_they_came_from(stages):
  assert [_metrics(stages / '1')[s]['train/batch_size'] for s in (1, 2, 3)] == [16, 16, 32]
  two, three = (json.loads((stages / n / 'config.json').read_text()) for n in '23')
  assert (two['model']['max_length'], two['model']['rope_theta'], two['data']['mask_rate']) == (256, 160000.0, 0.15)
  assert (three['data']['mask_rate'], three['optimizer']['schedule'], three['optimizer']['decay_shape']) == (
    0.05,
    'wsd',
    '1-sqrt',
  )
  origin = run_history(stages / '2')[0]['origin']
  assert (origin['from_checkpoint'], origin['step'], origin['keep_optimizer']) == (str(stages / '1'), STEPS, True)
  changed = {c['field']: (c['before'], c['after']) for c in origin['changes']}
  assert changed['model.rope_theta'] == (10000.0, 160000.0) and changed['model.max_length'] == (128, 256)
  origin = run_history(stages / '3')[0]['origin']
  assert origin['continue_data'] and {c['field']: c['after'] for c in origin['changes']}['data.mask_rate'] == 0.05
  # The moments came over with their own count (bias correction); the schedule restarted at each stage's step 0.
  assert _opt(stages / '1') == (3, 3) and _opt(stages / '2') == (3, 6) and _opt(stages / '3') == (3, 9)
  assert _metrics(stages / '2')[1]['train/learning_rate'] == 0.0  # stage 2 warms up again
  assert _metrics(stages / '3')[STEPS]['train/learning_rate'] == 0.0  # stage 3 decays to 0


@pytest.mark.slow
def test_stage_3_reads_on_where_stage_2_stopped(stages):
  cfg = config.from_record(json.loads((stages / '3' / 'config.json').read_text()), _stage('3'))
  it = pipeline.make_train_iterator(cfg.data, cfg.train.global_batch_size, cfg.model.max_length, seed=cfg.seed)
  saved = lambda n: json.loads((stages / n / 'checkpoints' / str(STEPS) / 'data' / 'process_0-of-1.json').read_text())
  it.set_state(saved('2'))
  for _ in range(STEPS):
    next(it)
  assert it.get_state() == saved('3')
  assert it.get_state() != saved('2')


@pytest.mark.slow
def test_a_resume_that_changes_theta_is_refused_with_one_line(stages, capsys):
  cfg = _stage('2', stages / '1')
  cfg.model.rope_theta, cfg.train.num_steps = 10000.0, STEPS + 1
  with pytest.raises(SystemExit), errors.reported('train'):
    train_only(cfg, stages / '2')
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(err) == 1 and 'model.rope_theta 160000.0 -> 10000.0' in err[0], err


@pytest.mark.slow
def test_continue_data_needs_the_same_row_stream(stages, tmp_path):
  cfg = _stage('3', stages / '2')
  cfg.model.max_length, cfg.data.mask_rate = 128, 0.1  # the rows are cut at another length (the mask rate may change)
  with pytest.raises(errors.ConfigError) as refused:
    train_only(cfg, tmp_path / 'three')
  assert 'model.max_length 256 -> 128' in str(refused.value) and 'mask_rate' not in str(refused.value)
  assert 'init.continue_data=False' in str(refused.value) and not (tmp_path / 'three' / 'checkpoints').exists()
