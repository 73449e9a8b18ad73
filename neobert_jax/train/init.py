"""Starting points other than random init: stage 2 and continued pretraining from a run or a Hugging Face NeoBERT.

The initialisers load parameters only: the optimizer moments, step counter and schedule start afresh, which is
what stage 2 of NeoBERT (a new 4096-token schedule) and continued pretraining want. The source is opened and read
by the weights layer (weights/source.py, which fine-tuning shares): a run's step straight onto the shardings, a
Hugging Face directory (a base-model save gets a fresh MLM decoder) shard by shard from the host.
"""

from __future__ import annotations

import logging

import ml_collections

from neobert_jax.engine.state import StateDefs, TrainState, with_params
from neobert_jax.weights import source as source_lib

log = logging.getLogger('neobert_jax.train')


def _source(cfg: ml_collections.ConfigDict) -> source_lib.Source | None:
  init = cfg.init
  src = source_lib.from_init(init.from_checkpoint, init.from_hf, init.step)
  if src is not None:
    src.check_fits(cfg.model)
  return src


def check_source(cfg: ml_collections.ConfigDict) -> None:
  """One line for an init source that is missing or of another architecture, before any model is built (the
  trainer calls it only for a run that starts afresh: a resumed run ignores cfg.init)."""
  _source(cfg)


def maybe_initialise(cfg: ml_collections.ConfigDict, defs: StateDefs, state: TrainState) -> TrainState:
  """Applies cfg.init to a freshly created state; returns it unchanged when cfg.init is empty."""
  src = _source(cfg)
  if src is None:
    return state
  params = src.sharded(state['params'])
  log.info('initialised parameters from %s%s', src.where, f' step {src.step}' if src.step is not None else '')
  return with_params(defs, state, params)
