"""benchmarks/pretraining_helps.py: with no fine-tuning flags it fine-tunes with the fine-tuning config as it stands."""

import ml_collections

from benchmarks.pretraining_helps import FINETUNE_CONFIG, arguments
from neobert_jax import config
from neobert_jax.config import finetune as finetune_config


def test_the_defaults_are_the_fine_tuning_configs_own():
  args = arguments().parse_args(['--run', 'runs/tiny'])
  own = config.load(FINETUNE_CONFIG)
  assert (args.lr, args.lr_width) == (own.optimizer.lr, own.optimizer.lr_width)
  assert (args.epochs, args.batch_size, args.max_length) == (
    own.train.epochs,
    own.train.batch_size,
    own.data.max_length,
  )
  # the README's 128-wide model: the config's 2e-5, quoted for width 768, is 1.2e-4
  rate = finetune_config.effective_lr(ml_collections.ConfigDict({'lr': args.lr, 'lr_width': args.lr_width}), 128)
  assert abs(rate - 1.2e-4) < 1e-12


def test_flags_still_override_the_config():
  args = arguments().parse_args(['--run', 'runs/tiny', '--lr', '1e-4', '--lr-width', '0', '--epochs', '4'])
  assert (args.lr, args.lr_width, args.epochs) == (1e-4, 0, 4)
