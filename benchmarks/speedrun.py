"""Speedrun: which recipe crosses the neighbour line first, and which is lowest at the main job's time budget.

python -m benchmarks.speedrun [--only NAME,NAME] [--seeds 0] [--out runs/speedrun] [--table]

Every recipe is the README's main job (configs/tiny_cpu.py, 2,800 steps of 32 x 128 tokens) with a few fields
changed, trained by the real trainer (benchmarks/recipe_study.py's run_recipe: one process after the other, so
timings are not shared out) on the built-in corpus, with the held-out loss evaluated every 100 steps (no probe, no
export). `--seeds 0,1,2` runs each recipe once per seed (`--config.seed`, which also seeds the data order and the
masks); seed 0 is the main job itself. For each run it reads metrics.jsonl and reports:

  * the wall-clock seconds and tokens to reach the neighbour-count line (train/baselines.py, printed by the run at
    the evaluation's mask rate), each interpolated linearly between the two evaluations around the crossing;
  * the held-out loss at the main job's time budget: the training seconds of the 'main' recipe with the same seed
    in this run (the curve interpolated there; the last evaluation when a run ends sooner);
  * the final held-out loss and the training seconds;
  * the median seconds per step (train/step_time): how loaded the machine was during that run.

Seconds run from the first logged row (the step-0 evaluation, after start-up and its compile) and move with the
machine's load; losses per step do not. OUT/results.jsonl keeps every run (`--table` reprints the table from it),
OUT/speedrun.png draws every held-out curve against wall-clock seconds with the neighbour line. docs/performance.md
("Speedrun") holds the table of the last run.

A script, not part of the library: run it from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from benchmarks.recipe_study import run_recipe

EVERY = ('eval.every_steps=100', 'eval.probe_task=', 'checkpoint.every_steps=100000')
# Each recipe names its optimizer and rates in full, so it means the same whatever the main job's config holds.
ADAMW = ('optimizer.name=adamw', 'optimizer.peak_lr=5e-3', 'optimizer.muon_lr=0')  # AdamW on everything at 5e-3
DECODER_ADAMW = ('optimizer.muon_adamw=embeddings,decoder',)  # Muon on the layer's matrices only
DECODER_MUON = ('optimizer.muon_adamw=embeddings',)  # the decoder matrix on Muon too
# Muon at AdamW's rate on the layer's matrices (a later override of the same field wins, as in every recipe here)
MUON = ('optimizer.name=muon', 'optimizer.peak_lr=5e-3', 'optimizer.muon_lr=0', *DECODER_ADAMW)
BATCH_64 = ('train.global_batch_size=64', 'train.num_steps=1000', 'eval.every_steps=50', 'eval.num_batches=4')
HALF_BATCH = ('train.global_batch_size=16', 'train.num_steps=4000', 'eval.every_steps=200', 'eval.num_batches=16')


def wider(width: int, heads: int, init: float) -> tuple[str, ...]:
  return (f'model.hidden_size={width}', f'model.num_heads={heads}', f'model.intermediate_size={4 * width}',
          f'model.decoder_init_range={init}')  # fmt: skip


# name -> overrides of configs/tiny_cpu.py
RECIPES: dict[str, tuple[str, ...]] = {
  # the main job (8 heads, 2,800 steps since 2026-11-29; the rows before that date raced 4 heads over 2,000): Muon at
  # 1e-2 on the layer's matrices, AdamW at 2e-2 on the embedding, decoder, norms; it ships a moving average of 0.99
  # (scored as eval/ema/*), which `no_ema` leaves out (the weights scored)
  'main': (),
  'no_ema': ('train.ema_decay=0', 'export.use_ema=False'),
  'ema_warmup_0.2': ('optimizer.warmup_fraction=0.2',),  # the line sooner, a model that fine-tunes worse
  'ema_0.98': ('train.ema_decay=0.98',),
  'ema_0.995': ('train.ema_decay=0.995',),
  'adamw': ADAMW,
  'adamw_lr1e-2': (*ADAMW, 'optimizer.peak_lr=1e-2'),  # AdamW on everything at 1e-2
  'muon': MUON,  # Muon on the block matrices at AdamW's rate (muon_rate_scale='rms', 0.2), AdamW on the rest
  'muon_lr1e-2': (*MUON, 'optimizer.muon_lr=1e-2'),
  'muon_lr2e-2': (*MUON, 'optimizer.muon_lr=2e-2'),
  'muon_width_lr5e-2': (*MUON, 'optimizer.muon_rate_scale=width', 'optimizer.muon_lr=5e-2'),
  'muon_all_matrices': (*MUON, 'optimizer.muon_adamw='),  # the embedding and the decoder on Muon too
  'muon_warmup_0.1': (*MUON, 'optimizer.warmup_fraction=0.1'),  # a tenth of the run warming up, not 30%
  'muon_lr1e-2_warmup_0.1': (*MUON, 'optimizer.muon_lr=1e-2', 'optimizer.warmup_fraction=0.1'),
  'muon_lr1e-2_adamw_lr1e-2': (*MUON, 'optimizer.muon_lr=1e-2', 'optimizer.peak_lr=1e-2'),
  'muon_lr2e-2_adamw_lr2e-2': (*MUON, 'optimizer.muon_lr=2e-2', 'optimizer.peak_lr=2e-2'),
  'muon_lr1e-2_adamw_lr4e-2': (*MUON, 'optimizer.muon_lr=1e-2', 'optimizer.peak_lr=4e-2'),
  # half the rows per step, twice the steps: the same tokens in more, noisier updates (1.9x the steps per second)
  'muon_lr1e-2_batch_16': (*MUON, 'optimizer.muon_lr=1e-2', *HALF_BATCH),
  'mask_40_to_15': (*ADAMW, 'data.mask_rate_final=0.15'),  # arXiv 2305.15096's falling rate; evaluated at 40%
  'muon_mask_40_to_15': (*MUON, 'data.mask_rate_final=0.15'),
  # the main job (the decoder on AdamW, spelled out) with one field changed
  'decoder_adamw_noclip': (*DECODER_ADAMW, 'optimizer.clip_norm=0'),  # no global-norm clipping
  'decoder_adamw_wd0': (*DECODER_ADAMW, 'optimizer.weight_decay=0'),  # no weight decay on either side
  'decoder_adamw_wd0.2': (*DECODER_ADAMW, 'optimizer.weight_decay=0.2'),  # twice the decay on both sides
  'steps_2400': ('train.num_steps=2400',),  # the main job with 20% more steps (and time)
  'steps_2600': ('train.num_steps=2600',),  # 30% more steps: what fits in five minutes on the AMD EPYC
  'heads_8_steps_2300': ('model.num_heads=8', 'train.num_steps=2300'),  # eight heads, 15% more steps
  # what the accumulating dots' 1.24x step buys (model.dots, 2026-11-29): more steps in the same minutes
  'steps_3000': ('train.num_steps=3000',),
  'heads_8_steps_2800': ('model.num_heads=8', 'train.num_steps=2800'),
  'warmup_0.1': ('optimizer.warmup_fraction=0.1',),  # a tenth of the run warming up, not 30%: the line sooner?
  'muon_momentum_0.9': ('optimizer.muon_momentum=0.9',),  # Muon's momentum 0.9, not 0.95
  'embedding_muon': ('optimizer.muon_adamw=decoder',),  # the embedding on Muon, the decoder and norms on AdamW
  # the token embedding at its own rate (optimizer.embedding_lr), the decoder and norms still at 2e-2
  'embedding_lr_5e-3': ('optimizer.embedding_lr=5e-3',),
  'embedding_lr_1e-2': ('optimizer.embedding_lr=1e-2',),
  'embedding_lr_4e-2': ('optimizer.embedding_lr=4e-2',),
  # no weight decay: on the 4-head main it reached the line 150 steps sooner and ended 0.02 higher
  'wd0': ('optimizer.weight_decay=0',),
  # 16 rows a step over twice the steps: the same tokens in twice the updates, at the same seconds per row here
  'batch_16': ('train.global_batch_size=16', 'train.num_steps=5600', 'eval.every_steps=200', 'eval.num_batches=16'),
  # the batch doubling 8 -> 16 -> 32 over the first 2M tokens (config/ramp.py), the main job's tokens in all
  'ramp_8': ('train.batch_warmup_start=8', 'train.batch_warmup_tokens=2000000', 'train.num_steps=3614'),
  'decoder_muon': DECODER_MUON,
  'decoder_muon_noclip': (*DECODER_MUON, 'optimizer.clip_norm=0'),
  # a wider layer (heads of 32, SwiGLU 4x), the Linear init scaled by sqrt(128 / width) from the main job's 0.15
  'width_192': wider(192, 6, 0.12),
  'width_256': wider(256, 8, 0.106),
  'heads_2': ('model.num_heads=2',),  # two heads of 64: half the attention maps, the same projections
  'heads_8': ('model.num_heads=8',),  # eight heads of 16: twice the attention maps
  # rows of 64 tokens, twice as many per step: the same tokens and masked slots, half the attention span
  'seq_64': ('model.max_length=64', 'train.global_batch_size=64', 'data.max_predictions=32'),
  # twice the rows per step, half the steps: the same tokens in half the updates (the same 256 held-out rows)
  'batch_64': BATCH_64,
  'batch_64_lr_x1.4': (*BATCH_64, 'optimizer.muon_lr=1.4e-2', 'optimizer.peak_lr=2.8e-2'),  # rates x sqrt(2)
  # warmup over 10%, the peak held, then a straight line to zero over the last half
  'wsd_half': (
    'optimizer.schedule=wsd',
    'optimizer.wsd_decay_fraction=0.5',
    'optimizer.decay_shape=linear',
    'optimizer.warmup_fraction=0.1',
  ),
  # half the training tokens masked (more supervised slots per step), evaluated at the main job's 40%
  'mask_50': ('data.mask_rate=0.5', 'eval.mask_rate=0.4', 'data.max_predictions=80'),
}
MAIN_TOKENS_PER_STEP = 32 * 128  # the main job's; a run's own is read from its config.json


def crossing(curve: list[tuple[float, int, float, float]], line: float) -> tuple[float, float] | None:
  """(seconds, step) where the held-out curve first reaches `line`, linear between evaluations; None if never."""
  for (t0, s0, l0, _), (t1, s1, l1, _) in zip(curve, curve[1:]):
    if l1 <= line < l0:
      f = (l0 - line) / (l0 - l1)
      return t0 + f * (t1 - t0), s0 + f * (s1 - s0)
  return None


def loss_at(curve: list[tuple[float, int, float, float]], seconds: float) -> float:
  """The held-out loss at `seconds`, linear between evaluations (the last one past the curve's end)."""
  t, _, loss, _ = zip(*curve)
  return float(np.interp(seconds, t, loss))


def tokens_per_step(workdir: Path) -> int:
  """Rows x row length of the run's own config (a recipe may change the batch)."""
  cfg = json.loads((workdir / 'config.json').read_text())
  return cfg['train']['global_batch_size'] * cfg['model']['max_length']


def step_seconds(workdir: Path) -> float:
  """The median train/step_time of a run's metrics.jsonl (nan when it is gone)."""
  path = workdir / 'metrics.jsonl'
  if not path.is_file():
    return float('nan')
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return float(np.median([r['train/step_time'] for r in rows if 'train/step_time' in r]))


def summary(results: dict[str, dict]) -> list[dict]:
  """One row per run: crossing, loss at the budget of the 'main' run of its seed, final loss."""
  rows = []
  for key, r in results.items():
    line = float(r['neighbours'].split(',')[0])
    budget = results.get(f'main_s{r["seed"]}', r)['train_s']
    cross = crossing(r['curve'], line)
    rows.append(
      {
        'run': key,
        'recipe': r['recipe'],
        'seed': r['seed'],
        'line': line,
        'cross_s': cross[0] if cross else float('nan'),
        'cross_tokens': cross[1] * r.get('tokens_per_step', MAIN_TOKENS_PER_STEP) if cross else float('nan'),
        'at_budget': loss_at(r['curve'], budget),
        'budget_s': budget,
        'final': r['final_loss'],
        'train_s': r['train_s'],
        'step_s': r['step_s'],
      }
    )
  return rows


def table(rows: list[dict]) -> str:
  """The markdown table: per recipe, mean (and spread over seeds, when several) of each figure."""
  out = [
    '| recipe | seeds | s to the neighbour line | tokens to it | held-out at the budget | final held-out | '
    'training s | s / step |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
  ]
  recipes = sorted({r['recipe'] for r in rows}, key=lambda n: list(RECIPES).index(n) if n in RECIPES else len(RECIPES))
  for name in recipes:
    mine = [r for r in rows if r['recipe'] == name]

    def cell(key: str, fmt: str) -> str:
      v = np.asarray([r[key] for r in mine], np.float64)
      if np.isnan(v).all():
        return 'never'
      text = format(np.nanmean(v), fmt)
      return text + (f' +- {format(np.nanstd(v), fmt)}' if len(v) > 1 else '')

    out.append(
      f'| {name} | {len(mine)} | {cell("cross_s", ".0f")} | {cell("cross_tokens", ".3g")} | '
      f'{cell("at_budget", ".3f")} | {cell("final", ".3f")} | {cell("train_s", ".0f")} | {cell("step_s", ".3f")} |'
    )
  return '\n'.join(out)


def plot(results: dict[str, dict], rows: list[dict], path: Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
  colours = {name: f'C{i % 10}' for i, name in enumerate(dict.fromkeys(r['recipe'] for r in results.values()))}
  line = rows[0]['line']
  for ax, index, what in ((axes[0], 0, 'training seconds (2-core CPU; move with the load)'), (axes[1], 1, 'step')):
    for r in results.values():
      first = r['seed'] == min(x['seed'] for x in results.values() if x['recipe'] == r['recipe'])
      x, loss = [p[index] for p in r['curve']], [p[2] for p in r['curve']]
      ax.plot(x, loss, color=colours[r['recipe']], lw=1.2, alpha=0.85, label=r['recipe'] if first else None)
    ax.axhline(line, color='k', ls='--', lw=1, label=f'neighbour counts {line:.3f}')
    ax.set_xlabel(what)
    ax.set_ylim(3.8, 6.0)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('held-out MLM loss at 40% masking (nats)')
  axes[1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--only', default='', help='comma-separated recipe names (default: all)')
  ap.add_argument('--seeds', default='0', help='comma-separated seeds, e.g. 0,1,2 (seed 0 is the main job)')
  ap.add_argument('--out', default='runs/speedrun')
  ap.add_argument('--config', default='configs/tiny_cpu.py')
  ap.add_argument('--table', action='store_true', help='only print the table of OUT/results.jsonl and draw the plot')
  args = ap.parse_args()
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if not args.table:
    for seed in [int(s) for s in args.seeds.split(',')]:
      for name in args.only.split(',') if args.only else list(RECIPES):
        r = run_recipe(f'{name}_s{seed}', [*EVERY, *RECIPES[name], f'seed={seed}'], out, args.config)
        workdir = out / f'{name}_s{seed}'
        r.update(recipe=name, seed=seed, step_s=step_seconds(workdir), tokens_per_step=tokens_per_step(workdir))
        print(f'{name} seed {seed}: final {r["final_loss"]:.3f}, {r["train_s"]:.0f} s', flush=True)
        with open(out / 'results.jsonl', 'a') as f:
          f.write(json.dumps(r) + '\n')
  results = {}
  for line in (out / 'results.jsonl').read_text().splitlines():
    r = json.loads(line)
    r.setdefault('step_s', step_seconds(out / f'{r["recipe"]}_s{r["seed"]}'))
    results[f'{r["recipe"]}_s{r["seed"]}'] = r  # the last run of each recipe and seed
  rows = summary(results)
  plot(results, rows, out / 'speedrun.png')
  print(table(rows))


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  main()
