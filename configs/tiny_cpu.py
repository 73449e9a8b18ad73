"""A tiny NeoBERT trained on the built-in corpus in a few minutes on a 2-core CPU (the README's main job).

NeoBERT's architecture, all-[MASK] masking and sparse MLM head, scaled down to what 2 CPU cores can
train in under five minutes: 1 layer x 128 with 8 heads, 128-token packed rows, 32 rows per step, 2,800 steps,
~11.5M tokens (about five passes over the corpus's 2.4M). The built-in corpus is fetched, tokenized and sharded on
first use (cached); evaluation on its held-out split runs at the start and every 500 steps, with a linear probe of the
frozen embeddings on Amazon Fine Food reviews (eval.probe_task); the result is exported to a Hugging Face directory
next to the run. At the end the job prints the held-out loss against the unigram and neighbour-count baselines of
the held-out split, writes WORKDIR/loss_curve.md and loss_curve.png and shows fill-mask predictions on held-out
sentences through the export (neobert_jax/train/report.py).

What differs from the 250M recipe, and why (each measured on this corpus: docs/performance.md, "Recipe study"
and "Main job"):
  * vocabulary: `builtin-wordpiece-2048`, a WordPiece vocabulary learned from the corpus's training documents
    (data/prepare/corpus.py), instead of bert-base-uncased's 30522 ids: at this width the 30522-wide decoder and
    embedding would be ~3/4 of a step's work and each of their rows would see few training tokens.
  * 32 rows per step and 40% of tokens masked (NeoBERT: 20%): a small model in a short run is starved of
    supervised tokens; both lowered the held-out loss reached in a fixed time. Evaluation masks 40% too.
  * init: every Linear U(-0.15, 0.15) instead of NeoBERT's U(-0.02, 0.02). 0.02 is a width-768 scale; at width
    128 it leaves attention logits near zero, so attention stays uniform and the model sits on the unigram
    plateau for a hundred steps. The embedding keeps 0.02 (a larger one was worse).
  * optimizer: Muon (optax.contrib.muon) on the layer's weight matrices at a peak of 1e-2, AdamW on the embedding,
    the decoder and the norm scales at 2e-2, instead of AdamW on everything at NeoBERT's 6e-4. Over 2,000 steps (4
    heads) it ended 0.17 nats below AdamW at 5e-3 (4.055 against 4.227); AdamW on everything gains 0.03 from a
    higher rate (1e-2: 4.193), and 1e-2 or 4e-2 on the AdamW side under Muon end higher (docs/performance.md,
    "Speedrun").
  * schedule: one cycle: a linear warmup over the first 30% of the steps, then a straight line to zero at the last
    step (Cramming's one-cycle; Izsak et al.'s decay to zero at the deadline), not a short warmup and a cosine to
    10%. Over 2,000 steps it ended 0.12 nats below a 30-step warmup (AdamW, 3e-3). Under the moving average (below)
    a 20% warmup reaches the neighbour line sooner (near step 900 against 1,030) and ends level (3.945), but its
    model fine-tunes worse on two tasks nobody tuned for (bird_strike 0.675 against 0.684, tweet_source 0.832
    against 0.843; docs/performance.md, "Pretraining helps downstream").
  * bfloat16 compute (fp32 master weights, norms, softmax and loss), its dots accumulating in fp32 (model.dots
    'auto'): XLA:CPU runs bfloat16 x bfloat16 -> fp32 dots natively, about twice as fast as fp32 on CPUs with
    AVX-512 BF16 or AMX, so more steps fit in the same minutes, at the same loss per step.
  * the decoder writes bfloat16 logits (model.logits_dot_in_fp32=False; softmax and loss stay float32): half the
    bytes for the 2,048 x 2,048 logits of a step and their gradient, 1.10x the step on the Intel CPU here.
  * the model is the moving average of the weights (train.ema_decay=0.99, about the last 100 steps; export.use_ema),
    which the held-out curve, the report, the probe and the export are of: at the high rates of mid-run it sits
    0.2 nats below the weights (4.48 against 4.70 at step 1,000), so the neighbour line comes near step 1,050
    instead of 1,430, and it ends level with them (3.945 against 3.943). Averaging the latest weights stands in
    for a decayed rate (Kaddour 2022, "Stop wasting my time!", on BERT pretraining; Sanyal et al. 2023); 0.98 and
    0.995 reach the line later (docs/recipes.md, "Weight averaging").
  * one layer: per step it learned as fast as two at 1.7x the steps per second. Eight heads of 16, not NeoBERT's
    head width of 64: 0.84x the step, and over 2,800 steps they end at 3.943 where four heads over 3,000 steps, in
    about the same time, end at 3.977 (docs/performance.md, "Speedrun").
"""

from neobert_jax.config import train as base


def get_config():
  cfg = base.get_config()
  m = cfg.model
  m.hidden_size = 128
  m.num_layers = 1
  m.scan_layers = False  # one layer: nothing to scan over
  m.num_heads = 8  # heads of 16 (see above)
  m.intermediate_size = 512  # SwiGLU hidden 344
  m.max_length = 128  # training sequence length (packed rows)
  m.decoder_init_range = 0.15  # every Linear layer (see above); the embedding keeps embedding_init_range 0.02
  m.dtype = 'bfloat16'
  m.logits_dot_in_fp32 = False  # bfloat16 logits, float32 loss (see above)

  m.vocab_size = 2048
  cfg.data.tokenizer = 'builtin-wordpiece-2048'  # learned from the built-in corpus on first use (data.dir empty)
  cfg.data.mask_rate = 0.4
  cfg.data.max_predictions = 64  # sparse head: 40% of ~126 real tokens is ~50 masked slots per row
  cfg.data.block_docs = 512  # small blocks: the first batch is ready in well under a second

  cfg.mesh.fsdp = -1  # whatever CPU devices there are, as FSDP
  cfg.train.num_steps = 2800
  cfg.train.global_batch_size = 32
  cfg.train.ema_decay = 0.99  # the shipped model is the moving average of the weights (see above)

  o = cfg.optimizer
  o.name = 'muon'  # Muon on the layer's matrices, AdamW on the embedding, the decoder and the norms
  o.muon_lr = 1e-2
  o.peak_lr = 2e-2  # the AdamW side: a small model trained briefly tolerates (and needs) a larger rate
  o.warmup_steps, o.warmup_fraction = 0, 0.3  # one cycle: up over the first 30% of the steps...
  o.schedule, o.final_lr_fraction = 'linear', 0.0  # ...then a straight line to zero at the last step

  cfg.eval.every_steps = 500  # 8 x 32 rows of held-out text: ~13k masked tokens, +-0.02 on the loss
  cfg.eval.num_batches = 8
  cfg.eval.at_start = True  # step 0 on the curve (and tests/test_scenario_main_job.py reads it)
  cfg.eval.probe_task = 'fine_food'  # downstream signal beside the loss, with a random init's score as reference
  cfg.checkpoint.every_steps = 1000
  cfg.checkpoint.keep = 2
  cfg.logging.log_every = 20
  cfg.export.hf_dir = ''  # set e.g. --config.export.hf_dir=runs/tiny/hf to export at the end
  cfg.export.use_ema = True  # the run's model: the moving average (report, probe, export, a start from the run)
  return cfg
