"""MLM pretraining: `python -m neobert_jax.train --config=configs/<name>.py --workdir=runs/<name>`.

Modules: config (load, validate, resolve), optimizer, state (sharded creation), step (jitted train/eval steps),
batches (host data -> global arrays), checkpoint (Orbax), metrics (MFU, TensorBoard, JSONL), loop, __main__.
Nothing is imported here so that `from neobert_jax.engine import checkpoint` stays cheap for converters.
Owns pretraining. Imports model, data, config, sharding, distributed and weights/ (run directories and init
sources, the layer it shares with convert/ and fine-tuning). Never convert/:
the end-of-run export runs in neobert_jax/pretrain.py, above both.
"""
