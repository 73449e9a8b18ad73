"""A ModernBERT-style three-stage NeoBERT-250M: one warmup-stable-decay schedule split into three runs.

  stage 1  1024 tokens, RoPE theta 10k, 30% masked: a batch ramp 256 -> 2048 sequences over the first 50B
           tokens, 2,000 warmup steps to 6e-4, then the stable phase (no decay) for 800k steps (~1.6T tokens)
  stage 2  context extension to 8192 tokens with theta 160k (ModernBERT's global RoPE), 15% masked, the rate
           lowered to 3e-4 after a short re-warmup, 120k steps of 2M tokens (~250B), AdamW's moments carried over
  stage 3  the decay: 1 - sqrt over 25k steps (~50B tokens) from 3e-4 to 0, 5% masked (Ettin's and mmBERT's
           30% -> 15% -> 5%), the moments and the data position of stage 2 carried over

Each stage is a run of its own, started from the previous one's workdir (docs/recipes.md):

  python -m neobert_jax.train --config=configs/neobert_250m_stages.py:1 --workdir=runs/s1
  python -m neobert_jax.train --config=configs/neobert_250m_stages.py:2 --workdir=runs/s2 \\
      --config.init.from_checkpoint=runs/s1 --config.data.dir=<data prepared with --max-length 8192>
  python -m neobert_jax.train --config=configs/neobert_250m_stages.py:3 --workdir=runs/s3 \\
      --config.init.from_checkpoint=runs/s2 --config.data.dir=<the same as stage 2>

Each stage compiles ahead of time for both targets, e.g.
`python -m neobert_jax.compile --config=configs/neobert_250m_stages.py:2 --target=tpu:v5p-8` (and cuda:h100x8).
configs/tiny_cpu_stages.py is the same recipe at a size that trains in seconds on a CPU.
"""

from pathlib import Path

from neobert_jax import config


def apply(cfg, stage: str, previous: str = ''):
  """The stage's changes to a stage-1-shaped config: what every size of this recipe shares."""
  if stage not in ('1', '2', '3'):
    raise ValueError(f'unknown stage {stage!r} of the three-stage recipe: give :1, :2 or :3')
  o = cfg.optimizer
  o.schedule, o.final_lr_fraction = 'constant', 0.0  # stages 1 and 2: warmup, then the stable phase
  o.warmup_fraction = 0.0  # each stage's warmup is a step count (stage 3 has none), not a share of its steps
  cfg.data.mask_rate = 0.3
  if stage == '1':
    return cfg
  cfg.model.rope_theta = 160_000.0
  cfg.init.from_checkpoint, cfg.init.keep_optimizer = previous, True
  cfg.train.batch_warmup_tokens = cfg.train.batch_warmup_start = 0  # the ramp is stage 1's
  cfg.data.mask_rate = 0.15
  if stage == '3':
    o.schedule, o.decay_shape, o.wsd_decay_fraction, o.warmup_steps = 'wsd', '1-sqrt', 1.0, 0  # all decay
    cfg.data.mask_rate = 0.05
    cfg.init.continue_data = True  # stage 2's data, at its next unseen row
  return cfg


def get_config(stage: str = '1'):
  cfg = config.load(Path(__file__).with_name('neobert_250m.py'))  # the 250M model, its mesh and optimizer
  cfg = apply(cfg, stage, {'1': '', '2': 'runs/s1', '3': 'runs/s2'}[stage] if stage in '123' else '')
  t, o = cfg.train, cfg.optimizer
  if stage == '1':
    t.num_steps = 800_000
    t.batch_warmup_start, t.batch_warmup_tokens = 256, 50_000_000_000  # 256 -> 512 -> 1024 -> 2048
    cfg.data.max_predictions = 384  # 30% of 1024 = 307 on average
    return cfg
  cfg.model.max_length = 8192
  cfg.data.max_documents_per_row = 64  # rows 8x longer hold more documents (the packed layout's static bound)
  t.global_batch_size, t.grad_accum_steps = 256, 8  # 2M tokens per step, 4 rows x 8192 per H100 per micro-batch
  cfg.eval.every_steps = 2500
  if stage == '2':
    t.num_steps = 120_000
    o.peak_lr, o.warmup_steps = 3e-4, 500
    cfg.data.max_predictions = 1536  # 15% of 8192 = 1229 on average
  else:
    t.num_steps = 25_000
    o.peak_lr = 3e-4
    cfg.data.max_predictions = 512  # 5% of 8192 = 410 on average
  return cfg
