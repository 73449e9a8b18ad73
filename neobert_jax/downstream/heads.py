"""Downstream models around the pretrained encoder (under `encoder`, so its paths are a checkpoint's 'encoder.*' keys):
NeoBERT's classification head ([CLS] or, as ModernBERT's classifier_pooling, the mean: MLM never trains [CLS]'s
output) and the embedder. Dropout takes an explicit key, so the modules hold parameters only."""

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from neobert_jax.model.encoder import NeoBERT, pool_tokens
from neobert_jax.sharding import creation_scope


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def _linear(d_in: int, d_out: int, init_range: float, dtype: str, rngs: nnx.Rngs) -> nnx.Linear:
  # Kernels shard their input ('embed') axis like every encoder weight; the output axis is small, keep it whole.
  return nnx.Linear(
    d_in,
    d_out,
    use_bias=True,
    param_dtype=jnp.dtype(dtype),
    kernel_init=nnx.with_partitioning(nnx.initializers.normal(init_range), ('embed', None)),
    bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (None,)),
    rngs=rngs,
  )


class SequenceClassifier(nnx.Module):
  """Encoder + NeoBERT's classification head; returns float32 logits [B, num_outputs]."""

  def __init__(
    self,
    model_cfg: ml_collections.ConfigDict,
    num_outputs: int,
    dropout_rate: float,
    init_range: float,
    pooling: str = 'cls',
    *,
    rngs: nnx.Rngs,
  ):
    self.encoder = NeoBERT(model_cfg, rngs=rngs)
    self.pooling = pooling
    d = model_cfg.hidden_size
    with creation_scope():
      self.dense = _linear(d, d, init_range, model_cfg.param_dtype, rngs)
      self.classifier = _linear(d, num_outputs, init_range, model_cfg.param_dtype, rngs)
    self.dropout_rate = float(dropout_rate)

  def __call__(self, input_ids: jax.Array, lengths: jax.Array, key: jax.Array | None = None) -> jax.Array:
    hidden = self.encoder(input_ids, None, None, lengths)
    keys = jax.random.split(key) if key is not None else (None, None)
    x = dropout(pool_tokens(hidden, lengths, self.pooling), self.dropout_rate, keys[0])
    x = jnp.tanh(self.dense(x))
    x = dropout(x, self.dropout_rate, keys[1])
    return self.classifier(x).astype(jnp.float32)


class Embedder(nnx.Module):
  """Encoder + pooling; returns float32 sentence embeddings [B, D] (normalisation is the caller's choice)."""

  def __init__(self, model_cfg: ml_collections.ConfigDict, pooling: str, *, rngs: nnx.Rngs):
    self.encoder = NeoBERT(model_cfg, rngs=rngs)
    self.pooling = pooling

  def __call__(self, input_ids: jax.Array, lengths: jax.Array, key: jax.Array | None = None) -> jax.Array:
    del key  # the encoder has no dropout
    return pool_tokens(self.encoder(input_ids, None, None, lengths), lengths, self.pooling)
