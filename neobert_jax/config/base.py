"""The config schema: every field the trainer reads, with what it means and its default.

Recipes (configs/*.py) call `base.get_config()` and change fields; validation (neobert_jax/train/config.py) rejects
any key that is not defined here, so a typo in a config file or on the command line is an error, not a silent no-op.
The defaults are NeoBERT's stage-1 recipe (see configs/neobert_250m.py for the values spelled out).
Owns the field names and defaults only; imports the model and data sections' defaults, never train/ or convert/.
"""

from __future__ import annotations

import ml_collections

from neobert_jax.data.config import default_data_config
from neobert_jax.model.config import default_model_config


# Fields that moved: a config (file or --config.* override) that still sets the old name is told the new one.
RENAMED = {'train.compute_dtype': 'model.dtype'}


def get_config() -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  cfg.seed = 0  # parameter init and anything else random on the trainer side (the data has its own seed)

  # Model architecture and numerics (neobert_jax/model/config.py documents each field). `dtype` is the run's one
  # compute-dtype setting: 'auto' = bfloat16 on GPU/TPU, float32 on CPU (resolved once, at start-up, and written
  # to config.json), or 'float32' / 'bfloat16'; parameters stay `param_dtype` (fp32 master weights).
  cfg.model = default_model_config()
  cfg.model.dtype = 'auto'

  # Data pipeline (neobert_jax/data documents each field): corpus, tokenizer, sequence length, packing, masking.
  cfg.data = default_data_config()

  # Device mesh. data = pure data parallel (replicated params), fsdp = data parallel with params/optimizer
  # sharded, tensor = model parallel over heads / mlp / vocab.
  # data / fsdp / tensor are sizes INSIDE one TPU slice or GPU node (the fast ICI / NVLink links); their product
  # must equal the devices per slice or node, and one may be -1 (fill). dcn_data / dcn_fsdp say how many slices
  # or nodes the axis spans over the data-centre network (DCN); the axis's total size is the product, e.g.
  # data=1, fsdp=-1, dcn_data=2 on 2 slices of 256 chips = data 2 across slices x fsdp 256 inside each.
  # dcn_data x dcn_fsdp must equal the number of slices (TPU) or nodes (GPU); with both 1 (a single slice or
  # node) the sizes are simply the mesh. Tensor parallelism never crosses the DCN. Prefer dcn_data: FSDP across
  # slices gathers every layer's weights over the slow network (the compile report counts those bytes).
  cfg.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1, dcn_data=1, dcn_fsdp=1))

  cfg.train = ml_collections.ConfigDict(dict(
      num_steps=1_000_000,      # optimizer steps of the whole run (also sets the schedule length)
      global_batch_size=2048,   # sequences per optimizer step, summed over all processes
      grad_accum_steps=1,       # micro-batches per step; the global batch is split evenly across them
      nan_policy='stop',        # non-finite loss/grad: 'stop' (exit, name the last good checkpoint) or 'skip'
  ))

  # AdamW with linear warmup then cosine decay; decoupled weight decay on all weights except norms and biases.
  cfg.optimizer = ml_collections.ConfigDict(dict(
      peak_lr=6e-4,
      b1=0.9,
      b2=0.95,
      eps=1e-8,
      weight_decay=0.1,
      decay_embeddings=True,    # the paper decays every weight matrix, the token embedding included
      decay_all_params=False,   # True: norm scales and biases decay too (the original trainer's AdamW over
                                # model.parameters()); False: pulling RMSNorm gains towards 0 only fights the model
      clip_norm=1.0,            # global-norm clipping threshold; 0 disables
      clip_eps=0.0,             # clip by clip_norm / (norm + clip_eps): 1e-6 is torch's clip_grad_norm_ (the original)
      warmup_steps=2000,        # linear warmup_init_fraction * peak_lr -> peak_lr over this many steps
      warmup_init_fraction=0.0,  # the original trainer starts at 1e-4 * peak (torch LinearLR(start_factor=1e-4))
      decay_fraction=0.9,       # cosine reaches its floor after this fraction of num_steps, then stays there
      decay_steps=0,            # > 0: the original trainer's cosine instead: period decay_steps from the end of
                                # warmup, cut at ABSOLUTE step decay_steps, then the floor (decay_fraction unused)
      final_lr_fraction=0.1,    # floor = final_lr_fraction * peak_lr
  ))

  # Held-out evaluation (MLM loss and accuracy on the data's eval split).
  cfg.eval = ml_collections.ConfigDict(dict(
      every_steps=1000,         # 0 disables periodic evaluation
      num_batches=16,           # global batches per evaluation (fixed, deterministic subset)
      at_start=False,           # also evaluate before the first step (a baseline for the loss curve)
  ))

  # Orbax checkpoints in WORKDIR/checkpoints. Re-running the same command resumes from the latest complete one.
  cfg.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=1000,         # also saved at the end and on SIGTERM
      keep=3,                   # most recent checkpoints kept
      async_save=True,          # write arrays in the background while training continues
  ))

  # Initialise parameters (only; fresh optimizer and schedule) for stage 2 / continued pretraining. Ignored when
  # the workdir already has a checkpoint (resume wins). At most one of the two may be set.
  cfg.init = ml_collections.ConfigDict(dict(
      from_checkpoint='',       # a workdir or its checkpoints/ dir written by this trainer
      step=-1,                  # which step of from_checkpoint; -1 = latest
      from_hf='',               # a Hugging Face NeoBERT directory (config.json + weights)
  ))

  cfg.logging = ml_collections.ConfigDict(dict(
      log_every=10,             # steps between metric fetches (tensorboard, metrics.jsonl, progress bar)
      tensorboard=True,
      progress_bar=True,
      peak_flops_per_device=0.0,  # for MFU; 0 = look the device up in the table (CPU: measure a matmul)
      profile_start_step=-1,    # >= 0: write a jax.profiler trace of profile_num_steps steps from this one
      profile_num_steps=3,
  ))

  # After training, export the final parameters as a Hugging Face NeoBERT directory ('' = do not export).
  cfg.export = ml_collections.ConfigDict(dict(hf_dir=''))
  return cfg
