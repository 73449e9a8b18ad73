"""Data: tokenizers, `prepare` (text -> ArrayRecord shards), the Grain training pipeline.

The trainer needs only:
  from neobert_jax.data import default_data_config, make_train_iterator, make_eval_iterator
Owns everything from text to batches, and the download cache (assets.py). Must not import the model, train/ or
convert/; inside, assets <- tokenizer <- prepare <- corpus <- pipeline, never back.
"""

from neobert_jax.config.data import default_data_config, validate_data_config
from neobert_jax.data.pipeline import make_eval_iterator, make_train_iterator, open_prepared
