"""MLM pretraining: `python -m neobert_jax.train --config=configs/<name>.py --workdir=runs/<name>`.

Modules: config (load, validate, resolve), optimizer, state (sharded creation), step (jitted train/eval steps),
batches (host data -> global arrays), checkpoint (Orbax), metrics (MFU, TensorBoard, JSONL), loop, __main__.
Nothing is imported here so that `from neobert_jax.train import checkpoint` stays cheap for converters.
Owns pretraining. Imports model, data, config, sharding, distributed, checkpoint_io (the parameter and checkpoint
layer it shares with convert/). Imports convert/ (one way: convert never imports train/) only in init.py, for
init.from_hf and the end-of-run export.
"""
