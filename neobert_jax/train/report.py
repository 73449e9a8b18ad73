"""The end-of-run report of a pretraining job (process 0; docs/configuration.md): held-out loss against the
baselines, the loss curve and fill-mask through the export, the figures in WORKDIR/report.json for the model card."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import ml_collections

from neobert_jax import paths
from neobert_jax.config import train as train_config
from neobert_jax.data.pipeline import prepared
from neobert_jax.train import baselines, fill_mask
from neobert_jax.weights import runs
from neobert_jax.weights.runs import REPORT_FILE, loss_curve

log = logging.getLogger('neobert_jax.train')


def write_table(workdir: Path, bars: dict[str, Any] | None, every: int, item: str = runs.PARAMS_ITEM) -> Path:
  """WORKDIR/loss_curve.md: held-out rows (of the weights `item`) and every `every`-th train row, under the
  baselines (if computed); a run that ships the moving average shows its parameters' held-out loss beside it."""
  fmt = lambda v: f'{v:.3f}' if isinstance(v, float) else ''
  rows = loss_curve(workdir, item)
  held = 'held-out loss' if item == runs.PARAMS_ITEM else 'held-out loss (moving average)'
  extra = ('params_eval',) if item == runs.EMA_ITEM else ()
  probes = sorted({k for r in rows for k in r if k.startswith('probe/') and k.endswith('/accuracy')})
  if bars is not None:
    lines = ['Baselines of the held-out MLM loss (nats):', ''] + [f'- {b}' for b in baselines.baseline_lines(bars)]
  else:
    lines = ['Baselines of the held-out MLM loss: not computed (eval.baselines, docs/configuration.md).', '']
  for r in rows:
    for k in sorted(k for k in r if k.endswith('/random_init_accuracy')):
      lines.append(f'- {k.removesuffix("/random_init_accuracy")}: a random init of this shape scores {r[k]:.3f}')
  sources = sorted({k for r in rows for k in r if k.endswith('/loss')})  # a mixture's, each on its held-out split
  head = ['step', 'train loss', held, 'held-out accuracy'] + ['held-out loss (parameters)'] * len(extra)
  head += [p.removesuffix('/accuracy') for p in probes]
  head += [f'held-out loss {k.removesuffix("/loss")}' for k in sources]
  lines += ['', '| ' + ' | '.join(head) + ' |', '|' + '---:|' * len(head)]
  for r in rows:
    if 'eval' in r or r['step'] % every == 0:
      cells = [str(r['step'])] + [fmt(r.get(k)) for k in ('train', 'eval', 'eval_accuracy', *extra, *probes, *sources)]
      lines.append('| ' + ' | '.join(cells) + ' |')
  out = workdir / 'loss_curve.md'
  paths.write_text(out, '\n'.join(lines) + '\n')
  return out


def write_plot(workdir: Path, bars: dict[str, Any] | None, item: str = runs.PARAMS_ITEM) -> Path | None:
  """WORKDIR/loss_curve.png: the losses against minutes and steps (held-out: of the weights `item`, and of the
  parameters beside a moving average), the baselines as lines; None: no held-out row."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')  # files only, never a display
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = loss_curve(workdir, item)
  held = [r for r in rows if 'eval' in r]
  if not held:
    return None
  label = 'held-out' if item == runs.PARAMS_ITEM else 'held-out, moving average'
  t0 = min((r['time'] for r in rows if 'time' in r), default=None)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, axis in zip(axes, ('time', 'step')):
    if axis == 'time' and t0 is None:
      continue
    x = (lambda r: (r['time'] - t0) / 60) if axis == 'time' else (lambda r: r['step'])
    train = [r for r in rows if 'train' in r and (axis == 'step' or 'time' in r)]
    ax.plot([x(r) for r in train], [r['train'] for r in train], color='0.7', lw=1, label='train (batch)')
    timed = [r for r in held if axis == 'step' or 'time' in r]
    ax.plot([x(r) for r in timed], [r['eval'] for r in timed], 'o-', color='C0', label=label)
    if params := [r for r in timed if 'params_eval' in r]:
      ax.plot(
        [x(r) for r in params], [r['params_eval'] for r in params], '.-', color='C1', label='held-out, parameters'
      )
    if bars is not None:
      ax.axhline(bars['held_out'], color='C3', ls=':', label=f'unigram {bars["held_out"]:.2f}')
    if bars is not None and 'neighbours' in bars:
      n = bars['neighbours']['loss']
      ax.axhline(n, color='C2', ls='--', label=f'neighbour counts {n:.2f}')
    ax.set_xlabel('wall-clock minutes (from the first logged step)' if axis == 'time' else 'step')
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('MLM loss (nats)')
  lows = [r['eval'] for r in held]
  top = min(lows)
  if bars is not None:
    lows += [bars['held_out'], bars.get('neighbours', {}).get('loss', bars['held_out'])]
    top = max(bars['held_out'], top)
  axes[0].set_ylim(min(lows) - 0.3, top + 1.5)
  axes[1].legend(loc='upper right', fontsize=8)
  fig.tight_layout()
  out = workdir / 'loss_curve.png'
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=110)
  plt.close(fig)
  paths.write_bytes(out, png.getvalue())  # a gs:// workdir too: savefig(path) would open a local file of that name
  return out


def shipped(evals: list[dict[str, float]], item: str) -> list[dict[str, float]]:
  """The evaluation hooks' records (train/pretraining.py) with loss and accuracy of the weights `item`: a moving
  average's (its hook records ema_loss, ema_accuracy) in place of the parameters'."""
  if item == runs.PARAMS_ITEM:
    return evals
  return [{**e, 'loss': e[f'{item}_loss'], 'accuracy': e[f'{item}_accuracy']} for e in evals if f'{item}_loss' in e]


def _figures(bars: dict[str, Any]) -> dict[str, Any]:
  """One source's bars as report.json records them."""
  return {'unigram': {k: bars[k] for k in ('held_out', 'train')}, 'neighbours': bars['neighbours']}


def report(
  cfg: ml_collections.ConfigDict, workdir: Path, evals: list[dict[str, float]], sources: prepared.Sources | None = None
) -> dict[str, Any]:
  """The held-out loss against the baselines, the curve, fill-mask; the figures in WORKDIR/report.json."""
  seq_len = cfg.model.max_length
  mask_rate, when = train_config.eval_mask_rate(cfg), cfg.eval.baselines
  sources = sources or prepared.open_data(cfg.data, seq_len)
  per_bars = baselines.source_baselines(cfg.data, seq_len, mask_rate, when, sources)
  # The curve's bars: one source's (a mixture's first by name), a mixture's each source's below.
  bars = next(iter(per_bars.values()), None)
  per_bars = {} if sources.mix.plain else per_bars
  item = runs.exported_item(cfg)  # the held-out figures of the weights the run ships
  table = write_table(workdir, bars, max(cfg.logging.log_every, 1) * 5, item)
  plot = write_plot(workdir, bars, item)
  out: dict[str, Any] = {'curve': str(table)}
  if bars is not None:
    out.update(_figures(bars))
    log.info('baselines of the held-out loss:\n  %s', '\n  '.join(baselines.baseline_lines(bars)))
  if plot is not None:
    out['plot'] = str(plot)
  if evals:
    last = shipped(evals, item)[-1]
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
    out['baselines_per_source'] = {name: _figures(b) for name, b in per_bars.items()}
    losses = out.get('eval_loss_per_source', {})
    for name, b in per_bars.items():
      loss = f'held-out MLM loss {losses[name]:.3f} against ' if name in losses else ''
      own = f'unigram {b["held_out"]:.3f}, neighbour counts {b["neighbours"]["loss"]:.3f}'
      log.info('source %r: %sits own baselines: %s', name, loss, own)
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
