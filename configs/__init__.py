"""Training configs (ml_collections). Every config file defines `get_config()`.

The schema, every field with its documentation, lives in the package (neobert_jax/config/train.py; `base.py` here
re-exports it); the recipes start from it and change only what differs, so
`python -m neobert_jax.train --config=configs/<name>.py --config.optimizer.peak_lr=3e-4` overrides any field.
Recipes are loaded by path (neobert_jax.config.load), so they work from any directory with the package installed.
"""
