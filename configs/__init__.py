"""Training configs (ml_collections). Every config file defines `get_config()`.

`base.py` holds every field with its documentation; the other files start from it and change only what differs, so
`python -m neobert_jax.train --config=configs/<name>.py --config.optimizer.peak_lr=3e-4` overrides any field.
"""
