"""GLUE-style fine-tuning of a pretrained NeoBERT for classification or regression.

  python -m neobert_jax.finetune --config=configs/finetune_classification.py --workdir=runs/cls \
      --config.init.from_checkpoint=runs/stage1 --config.data.train_file=train.tsv \
      --config.data.validation_file=dev.tsv --config.data.text_field=sentence --config.data.label_field=label

Defaults are the paper's GLUE recipe: 10 epochs, AdamW, lr / batch / weight decay from the sweep grid's centre
(`python -m neobert_jax.finetune.sweep` searches the grid), linear decay after 10% warmup, head dropout 0.1.
One departure: the head reads the mean of the tokens (head.classifier_pooling='mean', ModernBERT's choice), not
NeoBERT's [CLS] vector, whose output MLM pretraining never trains. On the README's tiny model fine-tuned on
Amazon Fine Food reviews (benchmarks/pretraining_helps.py, 3 seeds) the mean scored 0.772 +- 0.012 where [CLS]
scored 0.741 +- 0.011 (4 epochs at 1e-3). `--config.head.classifier_pooling=cls` restores the paper's head.
The rate, 2e-5, is the paper's for its 768-wide model (optimizer.lr_width=768): a model of another width gets it
scaled by 768 / hidden_size (logged; optimizer.lr_width=0 uses the rate as given). The README's 128-wide model thus
fine-tunes at 1.2e-4: at 1e-4 for these 10 epochs it beat a random init by 0.025 (0.772 +- 0.001 against
0.747 +- 0.006), where at 2e-5 as given the random init won (docs/performance.md, "Pretraining helps downstream").
"""

from neobert_jax.config.finetune import base_config


def get_config():
  cfg = base_config('classification')
  cfg.train.epochs = 10
  cfg.train.batch_size = 32
  cfg.optimizer.lr = 2e-5
  cfg.optimizer.lr_width = 768  # NeoBERT's width, the rate's: scaled for other widths (see above)
  cfg.optimizer.weight_decay = 1e-2
  cfg.data.max_length = 128
  cfg.head.classifier_pooling = 'mean'
  return cfg
