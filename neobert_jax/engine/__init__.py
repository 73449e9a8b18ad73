"""The engine: the one trainer under pretraining (train/) and fine-tuning (finetune/).

Owns, one module each:
  session.py     `TrainingSession`, one command's time in a workdir assembled in one place (levanter's
                 Trainer.initial_state and default hooks, our way): the checkpoint manager, metrics writer,
                 progress bar, Logger, preemption, profiling, the default checkpoint hook and the closing (one
                 ExitStack); `restore_or_init` (a checkpoint with its data position, an init source, or fresh
                 parameters); `check_workdir`; `claim` (the workdir's lease for the whole job, taken by the job,
                 neobert_jax/lease.py); each checkpoint's save and upload times
  state.py       the sharded training state of any model factory
  step.py        the jitted step (`jit_train_step`, `StepOptions`): a task's summed loss, token-weighted gradient
                 accumulation, non-finite rollback
  trainer.py     `Trainer` (steps, hooks), `Logger` (throughput, MFU, the non-finite policy) and its `LogOptions`
  optimizer.py   clipping, AdamW, the warmup-cosine schedule, the weight-decay mask
  checkpoint.py  the one checkpoint writer (Orbax: params, optimizer state, data position, config) and resume
  preemption.py  stopping on SIGTERM at one step agreed by every process
  metrics.py     metrics.jsonl, TensorBoard, device peaks (a task passes its own FLOPs per token)

Imports only the layers below it (errors, paths, bucket, lease, hardware, sharding, config, model, data,
weights). Must not import a task or anything above it: not train/, finetune/, downstream/, convert/, evaluate/,
embed, aot/, compile or cli (tests/test_package_imports.py). Only engine/ and weights/ import Orbax. Nothing is
imported here, so `from neobert_jax.engine import checkpoint` does not pull in the rest.
"""
