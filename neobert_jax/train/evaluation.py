"""The held-out MLM evaluation as a trainer hook: each source's loss and accuracy on its held-out split, and their
total weighted by the step's mixture weights (a plain data.dir's one source is the total)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax

from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.train import batches as batches_lib


def _source(keys: tuple[str, ...], mesh: Any, eval_step: Any, batches: Iterable[dict], params: Any) -> dict:
  sums = jax.device_get([eval_step(params, batches_lib.stitch_micro_batches(b, keys, mesh, 1)) for b in batches])
  count = max(sum(float(s['count']) for s in sums), 1.0)
  return {
    'loss': sum(float(s['loss_sum']) for s in sums) / count,
    'accuracy': sum(float(s['correct']) for s in sums) / count,
  }


class HeldOut:
  """hook(step, state, logger): the held-out figures of state[`item`] ('params', or 'ema' for the moving
  average), written under `prefix` and kept in `records` ({step: figures}; the EMA's named ema_<figure>)."""

  def __init__(
    self,
    keys: tuple[str, ...],
    mesh: Any,
    eval_step: Any,
    batches: dict[str, Iterable[dict]],
    weights_at: Callable[[int], dict[str, float]] | None,
    item: str = 'params',
  ):
    self.keys, self.mesh, self.eval_step, self.batches, self.weights_at = keys, mesh, eval_step, batches, weights_at
    self.item, self.prefix = item, 'eval' if item == 'params' else f'eval/{item}'
    self.records: dict[int, dict[str, float]] = {}

  def evaluate(self, params: Any, step: int) -> dict[str, float]:
    per = {n: _source(self.keys, self.mesh, self.eval_step, b, params) for n, b in self.batches.items()}
    if self.weights_at is None:
      return next(iter(per.values()))
    weights = self.weights_at(step)
    total = sum(weights[n] for n in per) or 1.0
    out = {k: sum(weights[n] * m[k] for n, m in per.items()) / total for k in ('loss', 'accuracy')}
    return out | {f'{n}/{k}': v for n, m in per.items() for k, v in m.items()}

  def __call__(self, step: int, state: Any, logger: trainer_lib.Logger) -> None:
    ev = self.evaluate(state[self.item], step)
    logger.writer.write(step, ev, prefix=self.prefix)
    self.records[step] = ev if self.item == 'params' else {f'{self.item}_{k}': v for k, v in ev.items()}
    if jax.process_index() == 0:
      who = 'eval' if self.item == 'params' else f'eval ({self.item})'
      logger.say(f'{who} step {step}: loss {ev["loss"]:.4f}, accuracy {ev["accuracy"]:.4f}')


def merged(*hooks: Any) -> list[dict[str, float]]:
  """The evaluation hooks' records, one dict per evaluated step: {'step', 'loss', 'accuracy', ...}."""
  steps = sorted({s for h in hooks for s in h.records})
  return [{'step': s, **{k: v for h in hooks for k, v in h.records.get(s, {}).items()}} for s in steps]
