"""Data: tokenizers, `prepare` (text -> ArrayRecord shards), the Grain training pipeline.

The trainer needs only:
  from neobert_jax.data import default_data_config, make_train_iterator, make_eval_iterator
"""

from neobert_jax.data.config import default_data_config, validate_data_config
from neobert_jax.data.pipeline import make_eval_iterator, make_train_iterator, open_prepared
from neobert_jax.data.shards import DataError
