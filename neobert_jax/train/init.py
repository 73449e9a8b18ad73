"""Starting points other than random init: stage 2 and continued pretraining from a run or a Hugging Face NeoBERT.

Both initialisers load parameters only: the optimizer moments, step counter and schedule start afresh, which is
what stage 2 of NeoBERT (a new 4096-token schedule) and continued pretraining want. A Hugging Face directory is
read through model/hf_layout.py (the layout convert/ exports), never through convert/: train and convert do not
import each other.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import jax
import ml_collections
import numpy as np
from flax import nnx

from neobert_jax import checkpoint_io, errors, paths
from neobert_jax.model import hf_layout
from neobert_jax.train.state import StateDefs, TrainState, with_params

log = logging.getLogger('neobert_jax.train')

# Fields that change parameter shapes; the rest (max_length, dtype, attention kernel, remat) may differ.
SHAPE_FIELDS = ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size')


def check_compatible(source: ml_collections.ConfigDict, target: ml_collections.ConfigDict, where: str) -> None:
  diff = {f: (source[f], target[f]) for f in SHAPE_FIELDS if f in source and source[f] != target[f]}
  if diff:
    raise errors.CheckpointError(f'cannot initialise from {where}: model fields differ (source, this run): {diff}')


def _abstract_pure(params: Any) -> Any:
  return nnx.to_pure_dict(jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), params))


def params_from_checkpoint(path: str, step: int | None, like: Any) -> Any:
  """Another run's parameters, read straight onto the shardings of `like` (no host gather)."""
  try:
    tree, step = checkpoint_io.restore_param_tree(path, step, _abstract_pure(like))
  except FileNotFoundError as e:
    raise errors.CheckpointError(f'init.from_checkpoint={path!r}: {e}; give a workdir (or its checkpoints/) of a '
                                 'run that saved at least one step') from None
  params = jax.tree.map(lambda a: a, like)
  nnx.replace_by_pure_dict(params, tree)
  log.info('initialised parameters from %s step %d', path, step)
  return params


def params_from_flat(flat: Mapping[str, np.ndarray], like: Any) -> Any:
  """Flat {dotted key: array} (neobert_jax.model.params layout) -> params sharded like `like`.

  Each process builds only the shards its devices hold, from its own host copy of the flat arrays.
  """
  expected = checkpoint_io.flatten(nnx.to_pure_dict(like))
  checkpoint_io.check_keys_and_shapes(
      flat, {k: tuple(v.shape) for k, v in expected.items()}, 'the parameters to initialise from',
      'initialise from a checkpoint of the same architecture (layers, width, heads, vocab, intermediate_size)')

  def put(key: str, ref: jax.Array) -> jax.Array:
    host = np.asarray(flat[key], dtype=ref.dtype)
    return jax.make_array_from_callback(ref.shape, ref.sharding, lambda idx: host[idx])

  params = jax.tree.map(lambda a: a, like)
  nnx.replace_by_pure_dict(params, checkpoint_io.unflatten({k: put(k, v) for k, v in expected.items()}))
  return params


def check_source(cfg: ml_collections.ConfigDict) -> None:
  """One line for an init source that is missing or of another architecture, before any model is built (the
  trainer calls it only for a run that starts afresh: a resumed run ignores cfg.init)."""
  init = cfg.init
  if init.from_checkpoint:
    path = paths.resolve(init.from_checkpoint, 'init.from_checkpoint')
    try:
      if not path.is_dir() or checkpoint_io.latest_step(path) is None:
        raise FileNotFoundError('no complete checkpoint there')
      source = checkpoint_io.read_config(path).model
    except (FileNotFoundError, ValueError) as e:
      raise errors.CheckpointError(f'init.from_checkpoint={init.from_checkpoint!r}: {e}; give the workdir (or its '
                                   'checkpoints/) of a run that saved at least one step') from None
    check_compatible(source, cfg.model, init.from_checkpoint)
  if init.from_hf and not (paths.resolve(init.from_hf, 'init.from_hf') / 'config.json').is_file():
    raise errors.CheckpointError(f'init.from_hf={init.from_hf!r} is not a Hugging Face model directory (no '
                                 'config.json there); give the local directory of a NeoBERT save (config.json + '
                                 'model.safetensors or pytorch_model.bin)')


def maybe_initialise(cfg: ml_collections.ConfigDict, defs: StateDefs, state: TrainState) -> TrainState:
  """Applies cfg.init to a freshly created state; returns it unchanged when cfg.init is empty."""
  init = cfg.init
  if init.from_checkpoint:
    check_compatible(checkpoint_io.read_config(init.from_checkpoint).model, cfg.model, init.from_checkpoint)
    step = None if init.step < 0 else int(init.step)
    return with_params(defs, state, params_from_checkpoint(init.from_checkpoint, step, state['params']))
  if init.from_hf:
    # A base-model save has no MLM head; continued pretraining needs one, so a fresh decoder is created.
    local = paths.local_copy(init.from_hf, marker='config.json')  # a bucket's directory is read from a copy
    model_cfg, flat = hf_layout.read_hf_dir(local, init_missing_decoder=True)
    check_compatible(model_cfg, cfg.model, init.from_hf)
    log.info('initialised parameters from Hugging Face directory %s', init.from_hf)
    return with_params(defs, state, params_from_flat(flat, state['params']))
  return state
