"""NeoBERT stage 2: extend the stage-1 model to 4,096-token sequences (50k steps of ~2M tokens, 100B tokens).

Parameters come from a stage-1 run (init.from_checkpoint; RoPE has no length-dependent weights, so the same
parameters serve 4096 positions); the optimizer moments, step counter and schedule start afresh.
Batches are 512 x 4,096 tokens. The paper gives no separate stage-2 optimizer; this keeps stage 1's AdamW and a
short warmup-cosine schedule over the 50k steps. Point data.dir at data prepared with --max-length 4096.
Usage: python -m neobert_jax.train --config=configs/neobert_250m_4096.py --workdir=runs/neobert_250m_4096 \
         --config.init.from_checkpoint=runs/neobert_250m
"""

from pathlib import Path

from neobert_jax import config


def get_config():
  cfg = config.load(Path(__file__).with_name('neobert_250m.py'))  # by path: no sys.path needed
  cfg.model.max_length = 4096
  # `python -m neobert_jax.compile --plan --target=cuda:h100x8` (docs/performance.md): with cuDNN flash attention
  # no T x T tensor exists, so 8 rows x 4096 per device train without remat in 24.6 GiB of 80, ~25% faster by the FLOP
  # model than full remat (which the bias kernel's [T, T] tensor would need). Smaller GPUs: 'save_dots' or 'full'.
  cfg.model.remat_policy = 'none'
  cfg.data.max_documents_per_row = 32  # rows 4x longer hold more documents (the packed layout's static bound)
  cfg.data.max_predictions = 896  # 20% of 4096 = 819 on average
  cfg.train.num_steps = 50_000
  cfg.train.global_batch_size = 512
  cfg.train.grad_accum_steps = 8  # 8 rows per H100 per micro-batch (fsdp=8)
  cfg.optimizer.warmup_steps = 1000
  cfg.init.from_checkpoint = 'runs/neobert_250m'  # the stage-1 workdir (override on the command line)
  cfg.eval.every_steps = 2500
  cfg.checkpoint.every_steps = 500
  return cfg
