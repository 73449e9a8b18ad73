"""The one way flat host parameters become device arrays: onto shardings (each process builds only its devices'
shards) or onto the default device. No random init is spent: models are traced with `nnx.eval_shape`."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from neobert_jax import sharding as shd
from neobert_jax.weights.flat import check_keys_and_shapes, flatten, load_flat, unflatten


def params_from_flat(flat: Mapping[str, np.ndarray], like: Any) -> Any:
  """Flat {dotted key: array} -> params sharded like `like`; each process builds only its devices' shards."""
  expected = flatten(nnx.to_pure_dict(like))
  check_keys_and_shapes(
    flat,
    {k: tuple(v.shape) for k, v in expected.items()},
    'the parameters to initialise from',
    'initialise from a checkpoint of the same architecture (layers, width, heads, vocab, intermediate_size)',
  )

  def put(key: str, ref: jax.Array) -> jax.Array:
    host = np.asarray(flat[key], dtype=ref.dtype)
    return jax.make_array_from_callback(ref.shape, ref.sharding, lambda idx: host[idx])

  params = jax.tree.map(lambda a: a, like)
  nnx.replace_by_pure_dict(params, unflatten({k: put(k, v) for k, v in expected.items()}))
  return params


def with_encoder(params: Any, flat: Mapping[str, np.ndarray]) -> Any:
  """`params` with the encoder replaced by `flat`'s 'encoder.*' entries, on its shardings; the head keeps its own."""
  encoder = {k[len('encoder.') :]: v for k, v in flat.items() if k.startswith('encoder.')}
  out = jax.tree.map(lambda a: a, params)
  out['encoder'] = params_from_flat(encoder, params['encoder'])
  return out


def sharded_params(
  make_model: Callable[[], nnx.Module], flat: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh
) -> tuple[Any, Any, Any]:
  """(graphdef, params, shardings) for inference, each device receiving only its shard of `flat`."""
  with shd.activate(mesh):
    graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
    shardings = nnx.get_named_sharding(abstract, mesh)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  return graphdef, params_from_flat(flat, abstract), shardings


def model_from_flat(make_model: Callable[[], nnx.Module], flat: Mapping[str, np.ndarray]) -> nnx.Module:
  """A model holding `flat` on the default device (no mesh). Keys and shapes are checked first (ValueError)."""
  graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
  model = nnx.merge(graphdef, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract))
  load_flat(model, flat)
  return model
