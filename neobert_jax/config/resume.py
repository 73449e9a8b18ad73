"""What a resumed run may change (docs/configuration.md, "Resuming with a changed config"): each field is identity,
schedule or free by its longest named prefix; a section the table does not name is identity, so its new fields are
refused on change until someone decides otherwise (tests/test_train_resume_config.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

IDENTITY, SCHEDULE, FREE = 'identity', 'schedule', 'free'

# Longest matching prefix wins ('model.dtype' over 'model').
PRETRAIN_RULES: dict[str, str] = {
  'seed': IDENTITY,
  'model': IDENTITY,  # shapes, vocabulary, sequence length, norms, RoPE, param dtype, layout
  'model.dtype': FREE,  # compute dtype: fp32 master weights either way
  'model.logits_dot_in_fp32': FREE,  # the decoder's output precision, likewise
  'model.dots': FREE,  # how the matmuls are written: the same numbers to the rounding
  'model.attention_impl': FREE,
  'model.splash_block_size': FREE,
  'model.blockwise_block_size': FREE,
  'model.remat_policy': FREE,
  'data': IDENTITY,  # corpus, tokenizer, packing, masking, data seed, block size, workers
  'data.worker_buffer_size': FREE,
  'data.cache_gb': FREE,  # how much of the corpus a host keeps on disk, not which rows it reads
  # A mixture's weights may change from the resume step on; its sources may not (the pipeline refuses that itself,
  # naming the source, unless data.mixture_fresh names it).
  'data.mixture_sources': SCHEDULE,
  'data.mixture': FREE,  # where the file is; what it says is data.mixture_sources
  'data.mixture_fresh': FREE,
  'mesh': FREE,  # restore works onto any mesh and any process count
  'train': IDENTITY,  # a new train field is refused on change until it is classified
  'train.num_steps': SCHEDULE,
  'train.global_batch_size': SCHEDULE,
  'train.grad_accum_steps': SCHEDULE,
  'train.nan_policy': FREE,
  'optimizer': SCHEDULE,
  # Another kind of schedule is another run's rest (its decay replaces the one the run was on): a new stage, started
  # with init.from_checkpoint. Its shape and lengths (num_steps, wsd_decay_fraction, decay_shape) stay schedule.
  'optimizer.schedule': IDENTITY,
  # Another optimizer, or another split of the weights between Muon and AdamW, is another optimizer state: a new stage
  # (init.from_checkpoint, which starts the optimizer afresh) may switch, a resume may not.
  'optimizer.name': IDENTITY,
  'optimizer.muon_adamw': IDENTITY,
  'eval': FREE,
  'checkpoint': FREE,
  'init': FREE,  # a checkpoint in the workdir wins over any init source
  'logging': FREE,
  'export': FREE,
  'run_id': FREE,  # who may take the workdir's lease back at once (lease.py), not what the run computes
}


# Fields whose unset value ('' or 0) is resolved at start and recorded resolved: unset on either side is no change.
RESOLVED_AT_START = ('data.tokenizer', 'data.virtual_shards', 'data.mixture_block_docs')


@dataclasses.dataclass(frozen=True)
class Change:
  field: str  # dotted, e.g. 'model.hidden_size'
  before: Any  # the recorded value (MISSING: the recorded config predates the field)
  after: Any
  kind: str  # IDENTITY | SCHEDULE | FREE

  def describe(self) -> str:
    return f'{self.field} {_show(self.before)} -> {_show(self.after)}'

  def to_json(self) -> dict[str, Any]:
    return {'field': self.field, 'before': self.before, 'after': self.after, 'kind': self.kind}


class _Missing:
  def __repr__(self) -> str:
    return '<not recorded>'


MISSING = _Missing()


def _show(value: Any) -> str:
  return repr(value) if isinstance(value, str) else str(value)


def rule(field: str, rules: Mapping[str, str]) -> str:
  """The kind of `field` under `rules` (longest matching prefix; IDENTITY when nothing matches)."""
  parts = field.split('.')
  for n in range(len(parts), 0, -1):
    kind = rules.get('.'.join(parts[:n]))
    if kind is not None:
      return kind
  return IDENTITY


def flat(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """Nested sections -> {'section.field': value} (the schema stays free of jax, so not weights.flat's)."""
  return {
    name: value
    for key, sub in tree.items()
    for name, value in (flat(sub, f'{prefix}{key}.') if isinstance(sub, Mapping) else {f'{prefix}{key}': sub}).items()
  }


def _same(a: Any, b: Any) -> bool:
  # JSON round trips turn tuples into lists and may turn 3.0 into 3; neither is a change.
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  return float(a) == float(b) if number(a) and number(b) else a == b


def diff(
  recorded: Mapping[str, Any],
  current: Mapping[str, Any],
  rules: Mapping[str, str],
  defaults: Mapping[str, Any] | None = None,
) -> list[Change]:
  """Every field whose value differs, classified, sorted by dotted field; one the record lacks is compared with
  `defaults` (what the older run implicitly used), one the schema lacks is ignored."""
  old, new = flat(recorded), flat(current)
  base = flat(defaults) if defaults is not None else {}
  changes = []
  for field in sorted(new):
    before = old.get(field, base.get(field, MISSING))
    if field in RESOLVED_AT_START and any(not isinstance(v, bool) and v in ('', 0) for v in (before, new[field])):
      continue  # unset on either side: the run's own recorded value
    if before is MISSING or not _same(before, new[field]):
      changes.append(Change(field, before, new[field], rule(field, rules)))
  return changes


def of_kind(changes: list[Change], kind: str) -> list[Change]:
  return [c for c in changes if c.kind == kind]
