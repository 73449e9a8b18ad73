"""Which recipe learns most in a few CPU minutes: held-out MLM loss against wall-clock time, recipe by recipe.

python -m benchmarks.recipe_study [--only NAME,NAME] [--steps-scale 1.0] [--out runs/recipe_study]

Every recipe is the README's main job (configs/tiny_cpu.py) with a few fields changed on the command line, trained
by the real trainer (`python -m neobert_jax.train`, one process after the other, so timings are not shared out)
on the built-in corpus. Each logs its held-out loss every `eval.every_steps`; this script reads the runs'
metrics.jsonl, prints one row per recipe (final held-out loss and accuracy, training seconds, tokens, the gap to
the neighbour-count baseline of the same held-out split at the same mask rate) and draws OUT/recipe_study.png:
held-out loss against wall-clock seconds, one curve per recipe, with the baselines.

The recipes sweep the levers the budget-BERT papers (Cramming, Geiping & Goldstein 2022; Izsak et al. 2021) found
decisive: depth x width, vocabulary size, peak learning rate and schedule shape (warmup-cosine, linear decay to
zero, one-cycle), batch size and a batch ramp, training vs evaluation mask rate, sequence length, clipping, and two
architecture levers NeoBERT fixes (biases in the blocks, a tied MLM decoder).
docs/performance.md ("Recipe study") holds the table of the last run and what it says about those papers.

A script, not part of the library: run it from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from neobert_jax.weights import runs

# name -> command-line overrides of configs/tiny_cpu.py. Steps are set so every recipe gets a similar budget.
RECIPES: dict[str, list[str]] = {}


def _recipe(name: str, *overrides: str) -> None:
  """A recipe: BEFORE with `overrides` on top (a field given twice keeps its last value)."""
  fields = {}
  for o in (*BEFORE, *overrides):
    key, _, value = o.partition('=')
    fields[key] = value
  RECIPES[name] = [f'{k}={v}' for k, v in fields.items()]


# Every recipe starts from the main job as it was before this study (pinned here, so that configs/tiny_cpu.py may
# move on): 1.84M tokens (450 steps of 32 x 128 unless a recipe changes the batch), evaluated every 150 steps.
BEFORE = (
  'train.num_steps=450',
  'model.dtype=float32',
  'model.decoder_init_range=0.02',
  'optimizer.schedule=cosine',
  'optimizer.final_lr_fraction=0.1',
  'optimizer.peak_lr=3e-3',
  'optimizer.warmup_steps=30',
  'optimizer.warmup_fraction=0.0',  # the main job warms up over 30% of its steps since the study
  'optimizer.name=adamw',  # the main job trains with Muon since the speedrun (benchmarks/speedrun.py)
  'optimizer.muon_lr=0',
  'eval.probe_task=',
  'logging.log_every=10',
)
_E = ('eval.every_steps=150', 'checkpoint.every_steps=100000')
LINEAR0 = ('optimizer.schedule=linear', 'optimizer.final_lr_fraction=0.0')
INIT = ('model.decoder_init_range=0.15',)  # every Linear U(-0.15, 0.15): about LeCun's scale at width 128
NEW = INIT + LINEAR0  # the study's base from the init rows on
_recipe('before', *_E)  # the main job as it was: cosine to 10%, NeoBERT's U(-0.02, 0.02) init, fp32
# schedule shape and peak rate
_recipe('linear_to_zero', *LINEAR0, *_E)
_recipe('cosine_to_zero', 'optimizer.final_lr_fraction=0.0', 'optimizer.decay_fraction=1.0', *INIT, *_E)
_recipe('one_cycle', 'optimizer.warmup_steps=225', *NEW, *_E)
_recipe(
  'wsd_1sqrt', 'optimizer.schedule=wsd', 'optimizer.decay_shape=1-sqrt', 'optimizer.final_lr_fraction=0.0', *INIT, *_E
)
_recipe('init_0.08', 'model.decoder_init_range=0.08', *LINEAR0, *_E)
_recipe('init_0.15', *NEW, *_E)
_recipe('init_0.15_embeddings_too', 'model.embedding_init_range=0.15', *NEW, *_E)
_recipe('lr_1e-3', 'optimizer.peak_lr=1e-3', *NEW, *_E)
_recipe('lr_6e-3', 'optimizer.peak_lr=6e-3', *NEW, *_E)
# depth x width
_recipe(
  'width_256', 'model.hidden_size=256', 'model.intermediate_size=1024', 'model.decoder_init_range=0.1', *LINEAR0, *_E
)
_recipe('layers_2', 'model.num_layers=2', 'model.scan_layers=True', *NEW, *_E)
_recipe('heads_2', 'model.num_heads=2', *NEW, *_E)
# vocabulary (each run's baselines are its own split's)
_recipe('vocab_1024', 'data.tokenizer=builtin-wordpiece-1024', 'model.vocab_size=1024', *NEW, *_E)
_recipe('vocab_8192', 'data.tokenizer=builtin-wordpiece-8192', 'model.vocab_size=8192', *NEW, *_E)
# batch size (same tokens)
_recipe(
  'batch_16',
  'train.global_batch_size=16',
  'train.num_steps=900',
  'optimizer.warmup_steps=60',
  *NEW,
  'eval.every_steps=300',
  'checkpoint.every_steps=100000',
)
_recipe(
  'batch_64',
  'train.global_batch_size=64',
  'train.num_steps=225',
  'optimizer.warmup_steps=15',
  *NEW,
  'eval.every_steps=75',
  'checkpoint.every_steps=100000',
)
_recipe(
  'batch_ramp', 'train.batch_warmup_tokens=460000', 'train.batch_warmup_start=8', 'train.num_steps=637', *NEW, *_E
)
# masking: train at another rate, always measured at 40%
_recipe('train_mask_0.2', 'data.mask_rate=0.2', 'eval.mask_rate=0.4', *NEW, *_E)
_recipe('train_mask_0.6', 'data.mask_rate=0.6', 'data.max_predictions=96', 'eval.mask_rate=0.4', *NEW, *_E)
# sequence length (same tokens per step)
_recipe('seq_64', 'model.max_length=64', 'train.global_batch_size=64', 'data.max_predictions=32', *NEW, *_E)
# clipping and numerics
_recipe('no_clipping', 'optimizer.clip_norm=0.0', *NEW, *_E)
_recipe('clip_0.5', 'optimizer.clip_norm=0.5', *NEW, *_E)
_recipe('bfloat16', 'model.dtype=bfloat16', *NEW, *_E)
# architecture levers NeoBERT fixes: biases in every block's Linears (Cramming drops them), a tied MLM decoder
_recipe('biases', 'model.use_bias=True', *NEW, *_E)
_recipe('tied_embeddings', 'model.tie_word_embeddings=True', *NEW, *_E)
# the main job's length: the candidates for configs/tiny_cpu.py
_recipe(
  'long_one_cycle',
  'train.num_steps=3000',
  'optimizer.warmup_steps=1500',
  'model.dtype=bfloat16',
  *NEW,
  'eval.every_steps=500',
  'checkpoint.every_steps=100000',
)
_recipe(
  'long_bf16',
  'train.num_steps=3000',
  'model.dtype=bfloat16',
  *NEW,
  'eval.every_steps=500',
  'checkpoint.every_steps=100000',
)

# 2,000 steps (the main job's length since the study): a short warmup, one cycle (30% warmup), one cycle at 5e-3
_LONG = ('train.num_steps=2000', 'model.dtype=bfloat16', *NEW, 'eval.every_steps=500', 'checkpoint.every_steps=100000')
_recipe('linear_2000', *_LONG)
_recipe('one_cycle_2000', *_LONG, 'optimizer.warmup_steps=0', 'optimizer.warmup_fraction=0.3')
_recipe(
  'one_cycle_2000_lr5e-3', *_LONG, 'optimizer.warmup_steps=0', 'optimizer.warmup_fraction=0.3', 'optimizer.peak_lr=5e-3'
)
_recipe(
  'one_cycle_3000_lr5e-3',  # the main job 1,000 steps longer: lower loss, the same fine-tuning (performance.md)
  *_LONG,
  'train.num_steps=3000',
  'optimizer.warmup_steps=0',
  'optimizer.warmup_fraction=0.3',
  'optimizer.peak_lr=5e-3',
)


def run_recipe(name: str, overrides: list[str], out: Path, config: str) -> dict:
  workdir = out / name
  if (workdir / 'metrics.jsonl').exists():
    subprocess.run(['rm', '-rf', str(workdir)], check=True)
  cmd = [sys.executable, '-m', 'neobert_jax.train', f'--config={config}', f'--workdir={workdir}']
  cmd += ['--config.logging.progress_bar=False', '--config.logging.tensorboard=False'] + [
    f'--config.{o}' for o in overrides
  ]
  start = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if proc.returncode:
    print(proc.stderr[-3000:], file=sys.stderr)
    raise SystemExit(f'recipe {name} failed (exit {proc.returncode})')
  rows = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines() if l.strip()]
  # the held-out figures of the weights the run ships: its moving average's with export.use_ema
  key = runs.eval_prefix(runs.exported_item(json.loads((workdir / 'config.json').read_text()))) + '/'
  evals = [r for r in rows if f'{key}loss' in r]
  t0 = rows[0]['time']
  report = next((l for l in proc.stderr.splitlines() if 'neighbour counts' in l), '')
  return {
    'name': name,
    'overrides': overrides,
    'wall_s': wall,
    'curve': [(r['time'] - t0, r['step'], r[f'{key}loss'], r[f'{key}accuracy']) for r in evals],
    'final_loss': evals[-1][f'{key}loss'],
    'final_accuracy': evals[-1][f'{key}accuracy'],
    'train_s': evals[-1]['time'] - t0,
    'neighbours': report.split(':')[-1].strip(),
  }


def table_and_plot(out: Path) -> str:
  """The markdown table of OUT/results.jsonl (the last result of each recipe, in run order) and OUT/recipe_study.png:
  each recipe's held-out curve against training seconds, with the neighbour-count line of the main vocabulary."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  results = {}
  for line in (out / 'results.jsonl').read_text().splitlines():
    r = json.loads(line)
    results[r['name']] = r
  rows = [
    '| recipe | held-out loss | accuracy | gap to neighbour counts | training s | changes |',
    '|---|---:|---:|---:|---:|---|',
  ]
  fig, ax = plt.subplots(figsize=(9, 5.5))
  for name, r in results.items():
    neighbours = float(r['neighbours'].split(',')[0]) if r['neighbours'] else float('nan')
    changes = ' '.join(o for o in r['overrides'] if o not in BEFORE + _E)
    rows.append(
      f'| {name} | {r["final_loss"]:.3f} | {r["final_accuracy"]:.3f} | {r["final_loss"] - neighbours:+.3f} | '
      f'{r["train_s"]:.0f} | `{changes}` |'
    )
    t, _, loss, _ = zip(*r['curve'])
    ax.plot(t, loss, marker='.', label=name)
  ax.set_xlabel('training seconds (2-core CPU, shared)')
  ax.set_ylabel('held-out MLM loss (nats)')
  ax.set_ylim(top=7.0)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(out / 'recipe_study.png', dpi=110)
  return '\n'.join(rows)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--only', default='', help='comma-separated recipe names (default: all)')
  ap.add_argument('--out', default='runs/recipe_study')
  ap.add_argument('--config', default='configs/tiny_cpu.py')
  ap.add_argument('--list', action='store_true')
  ap.add_argument('--table', action='store_true', help='only print the table of OUT/results.jsonl and draw the plot')
  args = ap.parse_args()
  if args.table:
    print(table_and_plot(Path(args.out)))
    return
  if args.list:
    for k, v in RECIPES.items():
      print(k, ' '.join(v))
    return
  names = args.only.split(',') if args.only else list(RECIPES)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  results = []
  for name in names:
    r = run_recipe(name, RECIPES[name], out, args.config)
    results.append(r)
    print(
      f'{name:28s} held-out {r["final_loss"]:.3f} acc {r["final_accuracy"]:.3f}  train {r["train_s"]:.0f}s '
      f'wall {r["wall_s"]:.0f}s  | {" ".join(r["overrides"])}',
      flush=True,
    )
    with open(out / 'results.jsonl', 'a') as f:
      f.write(json.dumps(r) + '\n')
  print(table_and_plot(out))


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  main()
