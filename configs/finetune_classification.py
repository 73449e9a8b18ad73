"""GLUE-style fine-tuning of a pretrained NeoBERT for classification or regression.

  python -m neobert_jax.finetune --config=configs/finetune_classification.py --workdir=runs/cls \
      --config.init.from_checkpoint=runs/stage1 --config.data.train_file=train.tsv \
      --config.data.validation_file=dev.tsv --config.data.text_field=sentence --config.data.label_field=label

Defaults are the paper's GLUE recipe: 10 epochs, AdamW, lr / batch / weight decay from the sweep grid's centre
(`python -m neobert_jax.finetune.sweep` searches the grid), linear decay after 10% warmup, head dropout 0.1.
"""

from neobert_jax.config.finetune import base_config


def get_config():
  cfg = base_config('classification')
  cfg.train.epochs = 10
  cfg.train.batch_size = 32
  cfg.optimizer.lr = 2e-5
  cfg.optimizer.weight_decay = 1e-2
  cfg.data.max_length = 128
  return cfg
