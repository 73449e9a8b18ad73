"""Contrastive fine-tuning for sentence embeddings (NeoBERT's MTEB recipe: mean pooling, InfoNCE, temperature 0.07).

  python -m neobert_jax.finetune --config=configs/finetune_contrastive.py --workdir=runs/emb \
      --config.init.from_checkpoint=runs/stage1 --config.data.train_file=pairs.jsonl \
      --config.data.query_field=query --config.data.positive_field=positive --config.data.negative_field=negative

In-batch negatives come from the whole data-parallel batch (every device's positives and hard negatives); per-dataset
instructions: --config.data.dataset_field=dataset --config.data.instructions=instructions.json.
"""

from neobert_jax.config.finetune import base_config


def get_config():
  cfg = base_config('contrastive')
  cfg.train.epochs = 1
  cfg.train.batch_size = 64
  cfg.optimizer.lr = 2e-5
  cfg.optimizer.weight_decay = 1e-2
  cfg.data.max_length = 256
  cfg.head.pooling = 'mean'
  cfg.head.temperature = 0.07
  return cfg
