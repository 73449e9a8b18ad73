"""MLM pretraining: `python -m neobert_jax.train --config=configs/<name>.py --workdir=runs/<name>`.

Modules: __main__ (the command and its job: the workdir's lease, then train, the Hugging Face export and the
report), pretraining (the job's wiring on engine/session.py: the run's config and resume plan, its data, its
evaluation, the trainer), mlm (the MLM model factory, init source, loss, FLOPs per token and jitted steps), batches
(host data -> global arrays), resume (comparing a resumed run's config with the recorded one, config history),
stage (a new stage from another run's step), probe (the downstream probe), report (the end-of-run report). The
trainer itself, its state, step, optimizer, checkpoints and metrics are the engine's (neobert_jax/engine/); the
config's schema, validation and resolution are config/train.py's.
Imports engine, model, data, config, sharding, distributed and weights (run directories and init sources). Never
convert/, except the command (__main__), an entry point, whose job runs the export. Nothing is imported here.
"""
