"""A new stage: a new run (its own --workdir) that starts from a step of another run (init.from_checkpoint).

Unlike a resume, a stage may change what the checkpoint is (sequence length, RoPE theta, mask rate, schedule, batch,
data, optimizer). The optimizer's moments come over with init.keep_optimizer (the same OPTIMIZER_FIELDS), the data
position with init.continue_data (the same STREAM_FIELDS). What `check` returns is the new run's 'origin' in
config_history.jsonl.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from neobert_jax.config import resume as resume_rules
from neobert_jax.config import train as train_config
from neobert_jax.errors import ConfigError
from neobert_jax.weights.source import Source

# The fields that lay out the training row stream: the data position of one run means the same rows in another only
# when these agree (the mask rate and the batch size may differ: masks are drawn per row, steps take whole rows).
STREAM_FIELDS = (
  'seed',
  'model.max_length',
  'data.dir',
  'data.tokenizer',
  'data.packing',
  'data.max_documents_per_row',
  'data.shuffle_seed',
  'data.block_docs',
  'data.shuffle_window',
  'data.virtual_shards',
)

# The fields that decide the optimizer state's tree: init.keep_optimizer carries the source's state over only when
# these agree.
OPTIMIZER_FIELDS = ('optimizer.name', 'optimizer.muon_adamw')


def check_stage(cfg: ml_collections.ConfigDict, src: Source | None) -> dict[str, Any] | None:
  """The origin of a run that starts from `src` (None: random init), for its history; with init.continue_data,
  refuses (one line) a row stream that is not the source's (its data.virtual_shards and data.mixture_block_docs,
  when this run leaves them unset, are taken from the source run: `stream`)."""
  if src is None:
    return None
  if src.kind != 'run':
    return {'from_hf': src.where}
  recorded = src.run_config.to_dict()
  init = cfg.init
  changes = _changes(recorded, cfg)
  if init.continue_data:
    _refuse_any(
      changes,
      STREAM_FIELDS,
      f'init.continue_data=True continues the row stream of {src.where} (step {src.step}), but this run lays out '
      'another',
      "keep those fields as the source has them, or set init.continue_data=False to read this run's data from its "
      'start',
    )
  if init.keep_optimizer:
    _refuse_any(
      changes,
      OPTIMIZER_FIELDS,
      f'init.keep_optimizer=True carries the optimizer state of {src.where} (step {src.step}) over, but this run '
      'builds another optimizer',
      "set init.keep_optimizer=False to start this run's optimizer afresh, or keep those fields as the source has them",
    )
  return {
    'from_checkpoint': src.where,
    'step': src.step,
    'keep_optimizer': bool(init.keep_optimizer),
    'continue_data': bool(init.continue_data),
    'changes': [c.to_json() for c in changes if c.kind != resume_rules.FREE],
  }


def stream(cfg: ml_collections.ConfigDict, src: Source | None) -> dict[str, Any]:
  """With init.continue_data, the source run's recorded layout of its row stream, which this run continues (what
  config/train.resolve_train takes for the fields left unset); {} otherwise."""
  if src is None or src.kind != 'run' or not cfg.init.continue_data:
    return {}
  data = src.run_config.to_dict()['data']
  return {k: data[k] for k in ('virtual_shards', 'mixture_block_docs') if k in data}


def _refuse_any(changes: list[resume_rules.Change], fields: tuple[str, ...], problem: str, fix: str) -> None:
  """One line naming the problem, each of `fields` that changed with both values, and the fix; None if none did."""
  moved = [c for c in changes if c.field in fields]
  if moved:
    raise ConfigError(f'{problem}: {"; ".join(c.describe() for c in moved)}. Fix: {fix}')


def _changes(recorded: dict[str, Any], cfg: ml_collections.ConfigDict) -> list[resume_rules.Change]:
  """The differences from the source run's config, classified as a resume would classify them."""
  return resume_rules.diff(recorded, cfg.to_dict(), resume_rules.PRETRAIN_RULES, train_config.get_config().to_dict())
