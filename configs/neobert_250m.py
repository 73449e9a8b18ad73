"""NeoBERT stage 1, as in the paper: the 250M model on 1024-token sequences for 1M steps of ~2M tokens.

AdamW (0.9, 0.95, eps 1e-8), weight decay 0.1 on all weights but norms and biases, global-norm clipping at 1.0,
2,000 warmup steps to 6e-4 then cosine decay to 10% of the peak over 90% of the steps; batches of 2,048 x 1,024
tokens (the paper's 32 per GPU x 8 GPUs x 8 accumulation steps); 20% of tokens chosen for the loss, every chosen
token replaced by [MASK]. bf16 compute with fp32 master weights on GPU/TPU (train.compute_dtype='auto').

Unlike the original code, documents are packed with attention kept inside each document, and only the masked
positions go through the MLM decoder (data.max_predictions; a row of 1024 tokens averages ~205 masked).
Point data.dir at a directory made by `python -m neobert_jax.data.prepare` (RefinedWeb for the real run).
"""

from neobert_jax.config import base


def get_config():
  cfg = base.get_config()  # the base defaults are this recipe; the stage-1 specifics are spelled out here
  cfg.model.max_length = 1024
  cfg.model.remat_policy = 'save_dots'  # fits 32 rows x 1024 per 80 GB device with room for the optimizer

  cfg.data.packing = 'packed'
  cfg.data.mask_rate = 0.2
  cfg.data.mask_strategy = 'all_mask'
  cfg.data.max_predictions = 256        # 20% of 1024 = 205 on average; rows above 256 keep a random 256

  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, 1  # FSDP over every device
  cfg.train.num_steps = 1_000_000
  cfg.train.global_batch_size = 2048
  cfg.train.grad_accum_steps = 8
  cfg.train.compute_dtype = 'auto'

  o = cfg.optimizer
  o.peak_lr, o.b1, o.b2, o.eps = 6e-4, 0.9, 0.95, 1e-8
  o.weight_decay, o.decay_embeddings, o.clip_norm = 0.1, True, 1.0
  o.warmup_steps, o.decay_fraction, o.final_lr_fraction = 2000, 0.9, 0.1

  cfg.eval.every_steps = 5000
  cfg.eval.num_batches = 16
  cfg.checkpoint.every_steps = 1000
  cfg.checkpoint.keep = 3
  cfg.logging.log_every = 50
  return cfg
