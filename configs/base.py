"""The config schema, re-exported: it lives in the package (neobert_jax/config/train.py), every field documented.

Kept so that `from configs import base` and `--config=configs/base.py` still work from a checkout.
"""

from neobert_jax.config.train import get_config  # noqa: F401  (re-export)
