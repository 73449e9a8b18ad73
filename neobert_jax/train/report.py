"""The end-of-run report of a pretraining job (process 0): the held-out loss against the baselines
(train/baselines.py), the loss curve (train/curve.py) and fill-mask through the export (train/fill_mask.py), with
the figures in WORKDIR/report.json for the exports' model card."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import ml_collections

from neobert_jax import paths
from neobert_jax.config import train as train_config
from neobert_jax.data.pipeline import prepared
from neobert_jax.train import baselines, curve, fill_mask
from neobert_jax.weights.runs import REPORT_FILE

log = logging.getLogger('neobert_jax.train')


def report(
  cfg: ml_collections.ConfigDict,
  workdir: Path,
  evals: list[dict[str, float]],
  sources: prepared.Sources | None = None,
) -> dict[str, Any]:
  """Logs the held-out loss against the baselines, writes the curve (table and plot), shows fill-mask examples if
  the run exported, and records the figures in WORKDIR/report.json (the exports' model card quotes them).
  `sources`: the run's data as it opened it (default: opened here)."""
  seq_len = cfg.model.max_length
  mask_rate, when = train_config.eval_mask_rate(cfg), cfg.eval.baselines
  sources = sources or prepared.open_data(cfg.data, seq_len)
  per_bars = baselines.source_baselines(cfg.data, seq_len, mask_rate, when, sources)
  # The curve's bars: one source's (a mixture's first by name), a mixture's each source's below.
  bars = next(iter(per_bars.values()), None)
  per_bars = {} if sources.mix.plain else per_bars
  table = curve.write_table(workdir, bars, max(cfg.logging.log_every, 1) * 5)
  plot = curve.write_plot(workdir, bars)
  out: dict[str, Any] = {'curve': str(table)}
  if bars is not None:
    out.update(unigram={k: bars[k] for k in ('held_out', 'train')}, neighbours=bars['neighbours'])
    log.info('baselines of the held-out loss:\n  %s', '\n  '.join(baselines.baseline_lines(bars)))
  if plot is not None:
    out['plot'] = str(plot)
  if evals:
    last = evals[-1]
    out['eval_loss'] = last['loss']
    said = ''
    if bars is not None:
      gap = bars['neighbours']['loss'] - last['loss']
      beats = f'{gap:.3f} below' if gap > 0 else f'{-gap:.3f} above'
      said = f': {bars["held_out"] - last["loss"]:.3f} below the unigram entropy, {beats} the neighbour-count baseline'
    shown = f' and {plot}' if plot is not None and bars is not None else ''
    step = (last['loss'], last['accuracy'], last['step'])
    log.info('held-out MLM loss %.3f (accuracy %.3f) at step %d%s; loss curve %s%s', *step, said, table, shown)
    per_source = {k.removesuffix('/loss'): v for k, v in last.items() if k.endswith('/loss') and '/' in k}
    if per_source:
      out['eval_loss_per_source'] = per_source
      log.info('held-out MLM loss per source: %s', ', '.join(f'{n} {v:.3f}' for n, v in sorted(per_source.items())))
  if per_bars:
    out['baselines_per_source'] = {
      n: {'unigram': {k: b[k] for k in ('held_out', 'train')}, 'neighbours': b['neighbours']}
      for n, b in per_bars.items()
    }
    losses = out.get('eval_loss_per_source', {})
    for name, b in per_bars.items():
      loss = f'held-out MLM loss {losses[name]:.3f} against ' if name in losses else ''
      log.info(
        'source %r: %sits own baselines: unigram %.3f, neighbour counts %.3f',
        name,
        loss,
        b['held_out'],
        b['neighbours']['loss'],
      )
  if cfg.export.hf_dir:
    try:
      filled = fill_mask.fill_mask(cfg.export.hf_dir, sources.config(cfg.data, sources.mix.names[0], False), seq_len)
    except ImportError as e:  # the torch extra is optional for training
      log.info('fill-mask examples need torch and transformers (pip install .[torch]): %s', e)
    else:
      log.info(
        'fill-mask through %s and transformers, one blank per row, the true token in the top 5 (first): %s. The '
        'first six whole words:\n  %s',
        cfg.export.hf_dir,
        '; '.join(
          f'{label} {filled[k]["top5"]} of {filled[k]["n"]} ({filled[k]["first"]})'
          for k, label in fill_mask.KINDS.items()
        ),
        '\n  '.join(filled['examples'][:6]),
      )
      out['fill_mask'] = filled
  # The figures, for the model card of the run's exports (convert/model_card.py): whole or absent.
  paths.write_text(paths.Path(workdir) / REPORT_FILE, json.dumps(out, indent=2, default=float) + '\n')
  return out
