"""The loss curve of a run: WORKDIR/loss_curve.md (train and held-out loss from metrics.jsonl, under the baselines)
and WORKDIR/loss_curve.png (the held-out curve against wall-clock minutes and steps, the baselines drawn in)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from neobert_jax import paths
from neobert_jax.train.baselines import baseline_lines
from neobert_jax.weights.runs import loss_curve  # the run's metrics.jsonl, read as the model card reads it


def write_table(workdir: Path, bars: dict[str, Any] | None, every: int) -> Path:
  """WORKDIR/loss_curve.md: held-out rows and every `every`-th train row, under the baselines (if computed)."""
  fmt = lambda v: f'{v:.3f}' if isinstance(v, float) else ''
  rows = loss_curve(workdir)
  probes = sorted({k for r in rows for k in r if k.startswith('probe/') and k.endswith('/accuracy')})
  if bars is not None:
    lines = ['Baselines of the held-out MLM loss (nats):', ''] + [f'- {line}' for line in baseline_lines(bars)]
  else:
    lines = ['Baselines of the held-out MLM loss: not computed (eval.baselines, docs/configuration.md).', '']
  for r in rows:
    for k in sorted(k for k in r if k.endswith('/random_init_accuracy')):
      lines.append(f'- {k.removesuffix("/random_init_accuracy")}: a random init of this shape scores {r[k]:.3f}')
  sources = sorted({k for r in rows for k in r if k.endswith('/loss')})  # a mixture's, each on its held-out split
  head = ['step', 'train loss', 'held-out loss', 'held-out accuracy'] + [p.removesuffix('/accuracy') for p in probes]
  head += [f'held-out loss {k.removesuffix("/loss")}' for k in sources]
  lines += ['', '| ' + ' | '.join(head) + ' |', '|' + '---:|' * len(head)]
  for r in rows:
    if 'eval' in r or r['step'] % every == 0:
      cells = [str(r['step'])] + [fmt(r.get(k)) for k in ('train', 'eval', 'eval_accuracy', *probes, *sources)]
      lines.append('| ' + ' | '.join(cells) + ' |')
  out = workdir / 'loss_curve.md'
  paths.write_text(out, '\n'.join(lines) + '\n')
  return out


def write_plot(workdir: Path, bars: dict[str, Any] | None) -> Path | None:
  """WORKDIR/loss_curve.png: held-out (and train) loss against wall-clock minutes and against steps, with the
  baselines as horizontal lines. None when no held-out row was logged."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')  # files only, never a display
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = loss_curve(workdir)
  held = [r for r in rows if 'eval' in r]
  if not held:
    return None
  t0 = min((r['time'] for r in rows if 'time' in r), default=None)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, axis in zip(axes, ('time', 'step')):
    if axis == 'time' and t0 is None:
      continue
    x = (lambda r: (r['time'] - t0) / 60) if axis == 'time' else (lambda r: r['step'])
    train = [r for r in rows if 'train' in r and (axis == 'step' or 'time' in r)]
    ax.plot([x(r) for r in train], [r['train'] for r in train], color='0.7', lw=1, label='train (batch)')
    timed = [r for r in held if axis == 'step' or 'time' in r]
    ax.plot([x(r) for r in timed], [r['eval'] for r in timed], 'o-', color='C0', label='held-out')
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
