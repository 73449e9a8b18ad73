"""The batch-size warmup (train.batch_warmup_tokens, train.batch_warmup_start): which batch each step trains on.
The rule, and why a run resumes exactly mid-ramp: docs/configuration.md, "Batch-size warmup"."""

from __future__ import annotations

import dataclasses
import math

import ml_collections


@dataclasses.dataclass(frozen=True)
class Phase:
  first_step: int  # the first step at this size
  size: int  # sequences per step
  tokens_before: int  # tokens (sequences x max_length) of every step before first_step


def enabled(cfg: ml_collections.ConfigDict) -> bool:
  return cfg.train.batch_warmup_tokens > 0


def read_rows(cfg: ml_collections.ConfigDict) -> int:
  """Sequences the data iterator hands out at a time (summed over processes): every step takes a whole number."""
  return cfg.train.batch_warmup_start if enabled(cfg) else cfg.train.global_batch_size


def sizes(cfg: ml_collections.ConfigDict) -> list[int]:
  """The batch sizes the run trains at, in order."""
  t = cfg.train
  if not enabled(cfg):
    return [t.global_batch_size]
  out = [t.batch_warmup_start]
  while 2 * out[-1] < t.global_batch_size:
    out.append(2 * out[-1])
  return out + [t.global_batch_size]


def phases(cfg: ml_collections.ConfigDict) -> list[Phase]:
  """Where each size starts (the last one lasts to the end of the run)."""
  t, seq = cfg.train, cfg.model.max_length
  all_sizes = sizes(cfg)
  out = [Phase(0, all_sizes[0], 0)]
  for size in all_sizes[1:]:
    prev = out[-1]
    threshold = t.batch_warmup_tokens * (size - all_sizes[0]) / (t.global_batch_size - all_sizes[0])
    per_step = prev.size * seq
    steps = max(math.ceil((threshold - prev.tokens_before) / per_step), 0)
    out.append(Phase(prev.first_step + steps, size, prev.tokens_before + steps * per_step))
  return out


def phase_at(table: list[Phase], step: int) -> Phase:
  """The phase of step `step` (0 = the first update)."""
  return [p for p in table if p.first_step <= step][-1]


def tokens_through(table: list[Phase], seq_len: int, done: int) -> int:
  """Tokens of the first `done` steps."""
  if done <= 0:
    return 0
  p = phase_at(table, done - 1)
  return p.tokens_before + (done - p.first_step) * p.size * seq_len


def validate_ramp(cfg: ml_collections.ConfigDict, shards: int, nproc: int) -> str | None:
  """Why this ramp cannot run on `shards` batch shards (data x fsdp) and `nproc` processes (one line), or None."""
  t = cfg.train
  if t.batch_warmup_tokens < 0 or t.batch_warmup_start < 0:
    return 'train.batch_warmup_tokens and train.batch_warmup_start must be >= 0 (batch_warmup_tokens=0: no ramp)'
  if not enabled(cfg):
    return None
  start, gb, accum = t.batch_warmup_start, t.global_batch_size, t.grad_accum_steps
  unit = accum * math.lcm(shards, nproc)  # what every size must be a multiple of
  fits = [d for d in range(unit, gb, unit) if gb % d == 0]
  example = (
    f'e.g. {gb // 8 if gb // 8 in fits else fits[0]}'
    if fits
    else f'none does for global_batch_size={gb}: raise it, or set train.batch_warmup_tokens=0'
  )
  if not 0 < start < gb or gb % start:
    return (
      f'train.batch_warmup_start={start} must divide train.global_batch_size={gb} and be smaller (the batch grows '
      f'from it by doublings to the global batch); {example}'
    )
  if start % unit:
    return (
      f'train.batch_warmup_start={start} does not split over train.grad_accum_steps={accum} micro-batches of '
      f'rows divisible by the batch shards (data x fsdp = {shards}) and the {nproc} processes; make it a multiple '
      f'of {unit} ({example})'
    )
  return None
