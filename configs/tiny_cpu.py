"""A tiny NeoBERT trained on the built-in corpus in a few minutes on a 2-core CPU (the README's main job).

Same tokenizer (bert-base-uncased, 30522 ids), architecture family, optimizer, masking and sparse MLM head as the
real recipe, scaled down: 2 layers x 128 wide, 128-token packed rows, 16 rows per step, 500 steps (~1M tokens).
The built-in corpus is tokenized and sharded on first use (cached), evaluation on its held-out split runs at the
start and every 100 steps, and the result is exported to a Hugging Face directory next to the run. At the end the
job prints the held-out loss against the unigram cross-entropy of the held-out split, writes WORKDIR/loss_curve.md
and shows fill-mask predictions on held-out sentences through the export (neobert_jax/train/report.py).

Where the steps go: the 30522-wide embedding and decoder are ~2/3 of a step's FLOPs at this width, so the body is
kept small and the budget is spent on steps; the MLM loss sits on a unigram plateau (~7.1) for the first few
hundred steps whatever the rate (1e-2 and 5e-3 were no faster than 2e-3 to 3e-3 here), so more steps, not a
larger rate, is what moves it.
"""

from neobert_jax.config import base


def get_config():
  cfg = base.get_config()
  m = cfg.model
  m.hidden_size = 128
  m.num_layers = 2
  m.num_heads = 4
  m.intermediate_size = 512      # SwiGLU hidden 344
  m.max_length = 128             # training sequence length (packed rows)

  cfg.data.max_predictions = 32  # sparse head: 20% of 128 tokens is ~26 masked slots per row
  cfg.data.block_docs = 512      # small blocks: the first batch is ready in well under a second

  cfg.mesh.fsdp = -1             # whatever CPU devices there are, as FSDP
  cfg.train.num_steps = 500
  cfg.train.global_batch_size = 16
  cfg.model.dtype = 'float32'

  o = cfg.optimizer
  o.peak_lr = 3e-3               # a small model trained briefly tolerates (and needs) a larger rate
  o.warmup_steps = 30

  cfg.eval.every_steps = 100      # 8 x 16 rows of held-out text: ~3.3k masked tokens, +-0.04 on the loss
  cfg.eval.num_batches = 8
  cfg.eval.at_start = True        # step 0 on the curve (and tests/test_train_tiny.py reads it)
  cfg.checkpoint.every_steps = 250
  cfg.checkpoint.keep = 2
  cfg.logging.log_every = 10
  cfg.export.hf_dir = ''         # set e.g. --config.export.hf_dir=runs/tiny/hf to export at the end
  return cfg
