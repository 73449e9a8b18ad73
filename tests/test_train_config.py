"""Configs: every shipped config validates; bad ones fail early with a message naming the field; the schedule and
weight-decay rules follow the paper."""

import glob
from pathlib import Path

import numpy as np
import pytest

from neobert_jax.errors import DataError
from neobert_jax import config
from neobert_jax.config import train as config_lib
from neobert_jax.engine import optimizer as opt_lib
from tests.support.tiny_train import tiny_config, train_only

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('path', sorted(glob.glob(str(REPO / 'configs' / '*.py'))))
def test_shipped_configs_validate(path):
  if path.endswith('__init__.py'):
    return
  cfg = config.load(path)
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, 1
  if Path(path).name.startswith('finetune_'):  # fine-tuning recipes have their own schema
    from neobert_jax.config import finetune as finetune_config

    cfg.data.train_file = 'train.tsv'  # the one field a user must give on the command line
    finetune_config.validate_finetune(cfg, num_devices=8)
    return
  config_lib.validate_train(cfg, num_devices=8)


def test_stage1_recipe_is_the_paper():
  cfg = config.load(str(REPO / 'configs' / 'neobert_250m.py'))
  o = cfg.optimizer
  assert (o.b1, o.b2, o.eps, o.weight_decay, o.clip_norm) == (0.9, 0.95, 1e-8, 0.1, 1.0)
  assert (o.warmup_steps, o.peak_lr, o.decay_fraction, o.final_lr_fraction) == (2000, 6e-4, 0.9, 0.1)
  assert cfg.train.num_steps == 1_000_000
  assert cfg.train.global_batch_size * cfg.model.max_length == 2048 * 1024  # ~2M tokens per step
  assert (cfg.data.mask_rate, cfg.data.mask_strategy) == (0.2, 'all_mask')
  s2 = config.load(str(REPO / 'configs' / 'neobert_250m_4096.py'))
  assert s2.model.max_length == 4096 and s2.init.from_checkpoint


def test_schedule_warmup_cosine_floor():
  cfg = tiny_config()
  cfg.optimizer.peak_lr, cfg.optimizer.warmup_steps, cfg.train.num_steps = 6e-4, 20, 1000
  _, sched = opt_lib.make_optimizer(cfg.optimizer, cfg.train.num_steps)
  lr = lambda s: float(sched(s))
  assert lr(0) == 0.0 and lr(10) == pytest.approx(3e-4) and lr(20) == pytest.approx(6e-4)
  assert lr(900) == pytest.approx(6e-5, rel=1e-3) and lr(999) == pytest.approx(6e-5, rel=1e-3)
  assert 6e-5 < lr(500) < 6e-4


def _schedule(kind, **fields):
  cfg = tiny_config()
  cfg.optimizer.update(dict(schedule=kind, peak_lr=1e-3, warmup_steps=10, warmup_init_fraction=0.0), **fields)
  cfg.train.num_steps = 100
  cfg = config_lib.validate_train(cfg, num_devices=8)
  _, sched = opt_lib.make_optimizer(cfg.optimizer, cfg.train.num_steps)
  return lambda step: float(sched(step))


def test_wsd_linear_and_constant_schedules_follow_their_formulas():
  f32 = lambda x: float(np.float32(x))
  # wsd: warmup over 10, the peak until the last 20 updates (80..99) decay; progress (t - 80 + 1) / 20
  for shape, left in (('1-sqrt', lambda p: 1 - p**0.5), ('linear', lambda p: 1 - p), ('cosine', None)):
    lr = _schedule('wsd', wsd_decay_fraction=0.2, decay_shape=shape, final_lr_fraction=0.1)
    assert lr(5) == f32(5e-4) and lr(10) == lr(50) == lr(79) == f32(1e-3)
    left = left or (lambda p: 0.5 * (1 + np.cos(np.pi * p)))
    for t in (80, 89, 95):
      assert lr(t) == f32(1e-4 + 9e-4 * left((t - 79) / 20)), (shape, t)
    assert lr(99) == lr(100) == lr(10**6) == f32(1e-4)  # the last update is at the floor, and stays there
  zero = _schedule('wsd', wsd_decay_fraction=0.2, final_lr_fraction=0.0)
  assert zero(99) == 0.0 and zero(98) > 0.0
  # linear: decays from the end of warmup to the floor at the last update (Cramming's one-cycle: warmup = N/2)
  lr = _schedule('linear', final_lr_fraction=0.0)
  assert lr(9) == f32(9e-4) and lr(10) == f32(1e-3 * (1 - 1 / 90)) and lr(54) == f32(5e-4) and lr(99) == 0.0
  lr = _schedule('constant')
  assert lr(0) == 0.0 and lr(10) == lr(99) == lr(500) == f32(1e-3)


def test_weight_decay_skips_norms_and_biases():
  names = {
    'encoder.token_embedding.embedding': True,
    'encoder.layers.qkv': True,
    'encoder.layers.w3': True,
    'encoder.layers.attention_norm': False,
    'encoder.layers.ffn_norm': False,
    'encoder.final_norm': False,
    'decoder.kernel': True,
    'decoder.bias': False,
  }
  for name, decays in names.items():
    assert opt_lib.decays(name.split('.')) is decays, name
  assert not opt_lib.decays('encoder.token_embedding.embedding'.split('.'), decay_embeddings=False)


@pytest.mark.parametrize(
  'override, message',
  [
    ({'optimizer.peak_lrr': 1.0}, 'unknown config key'),
    ({'mesh.data': 3}, 'mesh'),
    ({'train.global_batch_size': 12}, 'does not split over'),
    ({'train.grad_accum_steps': 3}, 'not divisible by train.grad_accum_steps'),
    ({'train.nan_policy': 'ignore'}, 'train.nan_policy'),
    ({'model.num_heads': 5}, 'num_heads'),
    ({'data.max_predictions': 1000}, 'max_predictions'),
    ({'model.dtype': 'float16'}, 'loss scaling'),
    ({'train.compute_dtype': 'bfloat16'}, 'train.compute_dtype is now model.dtype'),
    ({'optimizer.schedule': 'step'}, r"optimizer.schedule='step' is unknown; set one of cosine, wsd"),
    ({'optimizer.decay_shape': 'sqrt'}, r"optimizer.decay_shape='sqrt' is unknown; set one of linear, cosine, 1-sqrt"),
    ({'optimizer.wsd_decay_fraction': 0.0}, r'optimizer.wsd_decay_fraction=0.0 must be in \(0, 1\]'),
    ({'optimizer.wsd_decay_fraction': 1.5}, r'optimizer.wsd_decay_fraction=1.5 must be in \(0, 1\]'),
    ({'optimizer.final_lr_fraction': -0.1}, r'optimizer.final_lr_fraction=-0.1 must be in \[0, 1\]'),
    ({'train.batch_warmup_tokens': 1000}, 'train.batch_warmup_start=0 must divide train.global_batch_size=32'),
    ({'train.batch_warmup_tokens': 1000, 'train.batch_warmup_start': 3}, 'batch_warmup_start=3 must divide'),
    ({'train.batch_warmup_tokens': 1000, 'train.batch_warmup_start': 4, 'train.grad_accum_steps': 2}, 'multiple of 16'),
    ({'train.batch_warmup_tokens': -1}, 'train.batch_warmup_tokens and train.batch_warmup_start must be >= 0'),
    ({'data.mask_rate_final': 0.5}, r'data.mask_rate_final must be in \[0, data.mask_rate=0.4\]'),
    (
      {
        'train.num_steps': 450,  # the decay takes the last 405 steps, from step 45 on
        'optimizer.schedule': 'wsd',
        'optimizer.wsd_decay_fraction': 0.9,
        'optimizer.warmup_steps': 50,
        'optimizer.warmup_fraction': 0.0,
      },
      'warmup_steps=50 overlaps the decay of the last',
    ),
  ],
)
def test_bad_configs_fail_clearly(override, message):
  path = str(REPO / 'configs' / 'tiny_cpu.py')
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate_train(config.load(path, override), num_devices=8)


def test_typo_in_a_config_file_is_caught():
  cfg = tiny_config()
  cfg.train.num_step = 10  # typo: not a field of the schema (config/train.py)
  with pytest.raises(config_lib.ConfigError, match=r"unknown config keys \['train.num_step'\]"):
    config_lib.validate_train(cfg, num_devices=8)


def test_one_compute_dtype_setting():
  from neobert_jax.config.model import resolve_dtype

  assert config_lib.get_config().model.dtype == 'auto' and 'compute_dtype' not in config_lib.get_config().train
  assert (resolve_dtype('auto', 'cpu'), resolve_dtype('auto', 'tpu'), resolve_dtype('auto', 'cuda')) == (
    'float32',
    'bfloat16',
    'bfloat16',
  )
  cfg = tiny_config()
  cfg.model.dtype = 'auto'
  assert config_lib.resolve_train(cfg)[0].model.dtype == 'float32'  # this CPU
  cfg.train.compute_dtype = 'bfloat16'  # a recipe written before the rename is told where the setting went
  with pytest.raises(config_lib.ConfigError, match='train.compute_dtype is now model.dtype'):
    config_lib.validate_train(cfg, num_devices=8)


def test_vocab_mismatch_fails_before_the_model_is_built(tmp_path):
  cfg = tiny_config(vocab_size=1000)
  with pytest.raises(DataError, match='vocab_size=1000'):
    train_only(cfg, tmp_path)
  assert not (tmp_path / 'checkpoints').exists()


def test_validate_types_the_config_once_at_the_boundary():
  import ml_collections

  cfg = tiny_config()
  cfg.optimizer = ml_collections.ConfigDict(dict(cfg.optimizer.to_dict(), peak_lr=1, weight_decay=0))  # ints
  typed = config_lib.validate_train(cfg, num_devices=8)
  assert type(typed.optimizer.peak_lr) is float and type(typed.optimizer.weight_decay) is float
  cfg.train = ml_collections.ConfigDict(dict(cfg.train.to_dict(), num_steps='6'))
  with pytest.raises(config_lib.ConfigError, match=r"train.num_steps='6' is a str; the field is a int"):
    config_lib.validate_train(cfg, num_devices=8)
  # a recorded config.json: older (a field missing), newer (a field the schema lacks), numbers as JSON wrote them
  recorded = typed.to_dict()
  del recorded['optimizer']['clip_eps']
  recorded['train']['retired_field'] = 1
  recorded['optimizer']['final_lr_fraction'] = 0
  back = config.from_record(recorded, config_lib.get_config())
  assert back.optimizer.clip_eps == 0.0 and 'retired_field' not in back.train
  assert type(back.optimizer.final_lr_fraction) is float


def test_each_schema_resolves_auto_once_and_training_refuses_what_it_did_not_resolve(tmp_path):
  """config/train.resolve_train and config/finetune.resolve_finetune fill in the compute dtype, the attention kernel and the mesh
  (what config.json records); the compile command resolves for its target; a training session refuses 'auto'."""
  from neobert_jax.config import finetune as finetune_config
  from neobert_jax.config.model import KERNELS
  from neobert_jax.engine import session

  cfg = tiny_config()
  cfg.model.dtype = 'auto'
  resolved, choice = config_lib.resolve_train(config_lib.validate_train(cfg, num_devices=8), num_devices=8)
  assert (resolved.model.dtype, resolved.model.attention_impl, choice.kernel) == ('float32', 'xla', 'xla')
  assert resolved.model.dots == 'einsum'  # float32 on CPU: nothing to gain from accumulating dots
  cfg.model.dtype = 'bfloat16'
  assert config_lib.resolve_train(cfg, num_devices=8)[0].model.dots == 'accumulating'  # bfloat16 on CPU
  for platform in ('gpu', 'tpu'):
    assert config_lib.resolve_train(cfg, platform=platform, num_devices=8)[0].model.dots == 'einsum'
  cfg.model.dtype = 'auto'
  assert resolved.mesh.fsdp == 8 and cfg.model.dtype == 'auto'  # a copy: the input is left as it was
  on_gpu, choice = config_lib.resolve_train(cfg, platform='gpu', compute_capability='9.0', num_devices=8)
  assert (on_gpu.model.dtype, on_gpu.model.attention_impl) == ('bfloat16', 'cudnn') and choice.reason

  ft = finetune_config.base_config('classification')
  ft.data.train_file = 'train.tsv'
  ft = finetune_config.validate_finetune(ft, num_devices=8)
  source = ft.model.copy_and_resolve_references()
  source.hidden_size, source.dtype, source.attention_impl = 48, 'bfloat16', 'cudnn'  # the source's numerics: not ours
  out, _ = finetune_config.resolve_finetune(ft, source, 'bert-base-uncased', platform='cpu', num_devices=8)
  assert out.model.hidden_size == 48 and out.model.dtype == 'float32' and out.model.attention_impl in KERNELS
  assert out.model.dots == 'einsum'
  assert out.data.tokenizer == 'bert-base-uncased' and out.mesh.fsdp == 8

  with pytest.raises(ValueError, match="model.attention_impl='auto' reached training unresolved"):
    session.TrainingSession(tmp_path, cfg)
