"""MLM pretraining: `python -m neobert_jax.train --config=configs/<name>.py --workdir=runs/<name>`.

Modules: mlm (the MLM model factory, init source, loss and jitted steps), batches (host data -> global arrays),
runtime (the run-time choices: compute dtype, mesh sizes, attention kernel), resume (comparing a resumed run's
config with the recorded one, config history), loop (pretraining's wiring on engine/run.py: resolve the config
once, open the data, evaluate), report (the end-of-run report), __main__ (the command). The trainer itself, its
state, step, optimizer, checkpoints and metrics are the engine's (neobert_jax/engine/).
Imports engine, model, data, config, sharding, distributed and weights (run directories and init sources). Never
convert/: the end-of-run export runs in neobert_jax/pretrain.py, above both. Nothing is imported here.
"""
