"""Does pretraining help downstream? Fine-tune a pretraining run's model and a random init of the same shape.

python -m benchmarks.pretraining_helps --run runs/tiny [--task fine_food] [--seeds 0,1,2]   # the config as it stands
python -m benchmarks.pretraining_helps --run runs/tiny --lr 1e-4 --lr-width 0 --epochs 4   # other settings
python -m benchmarks.pretraining_helps --run runs/tiny --train-csv train.csv --test-csv test.csv   # your own task
python -m benchmarks.pretraining_helps --run runs/other --random-cache runs/random_arms   # the random arm kept

Both arms go through the project's own fine-tuning command (`python -m neobert_jax.finetune` with
configs/finetune_classification.py, whose rate, epochs, batch and length are the defaults here), with the same
hyper-parameters, seeds and tokenizer (the run's): the pretrained arm starts from the weights the run ships at its
latest checkpoint (--config.init.from_checkpoint: the moving average when the run set export.use_ema), the random arm
from a fresh init of the run's architecture (--config.model.* from the run's config.json). The task is a labelled
dataset that installs by package name (neobert_jax/data/labelled.py; fine_food: Amazon Fine Food reviews, great
vs other, 4000 train / 1000 test, text the pretraining corpus does not contain), scored on its test split.

Prints each seed's test accuracy, each arm's mean +- standard deviation over seeds, the difference, and whether the
pretrained arm wins by more than the seed spread (the larger of the two standard deviations). Writes the table to
OUT/pretraining_helps.json. A script, not part of the library: run it from the repository root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

import ml_collections

from neobert_jax import config as config_lib
from neobert_jax.config import finetune as finetune_config
from neobert_jax.config.model import default_model_config
from neobert_jax.data import labelled

FINETUNE_CONFIG = 'configs/finetune_classification.py'  # the fine-tuning config as it stands
# The run's architecture and its init distribution: the random arm is the pretraining run's own starting point.
ARCHITECTURE = (
  'vocab_size',
  'hidden_size',
  'num_layers',
  'num_heads',
  'intermediate_size',
  'max_length',
  'rope_theta',
  'embedding_init_range',
  'decoder_init_range',
  'use_bias',
  'tie_word_embeddings',
)


def finetune(run: Path, arm: str, seed: int, args: argparse.Namespace, out: Path) -> float:
  files = {'train': args.train_csv, 'test': args.test_csv} if args.train_csv else labelled.task_files(args.task)
  run_cfg = json.loads((run / 'config.json').read_text())
  cmd = [f'--config={FINETUNE_CONFIG}', f'--config.seed={seed}', f'--config.train.epochs={args.epochs}']
  cmd += [f'--config.optimizer.lr={args.lr}', f'--config.optimizer.lr_width={args.lr_width}']
  cmd += [f'--config.train.batch_size={args.batch_size}']
  cmd += [f'--config.data.train_file={files["train"]}', f'--config.data.validation_file={files["test"]}']
  cmd += [f'--config.data.max_length={args.max_length}', '--config.logging.progress_bar=False']
  cmd += ['--config.logging.tensorboard=False', '--config.model.dtype=float32']
  cmd += [f'--config.head.classifier_pooling={args.pooling}'] if args.pooling else []
  if arm == 'pretrained':
    cmd += [f'--config.init.from_checkpoint={run}']
  else:
    defaults = default_model_config()  # a run recorded before a field existed had its default
    cmd += [f'--config.model.{k}={run_cfg["model"].get(k, defaults[k])}' for k in ARCHITECTURE]
    cmd += [f'--config.data.tokenizer={run_cfg["data"]["tokenizer"]}']
  workdir = out / f'{arm}-seed{seed}'
  if arm == 'random' and args.random_cache:  # the arm depends on its flags only (shape, tokenizer, task, seed, rates)
    key = hashlib.sha256(json.dumps(cmd).encode()).hexdigest()[:16]
    workdir = Path(args.random_cache) / f'random-{key}-seed{seed}'
    if (workdir / 'results.json').exists():
      return float(json.loads((workdir / 'results.json').read_text())['final']['metrics']['accuracy'])
  subprocess.run(['rm', '-rf', str(workdir)], check=True)
  cmd = [sys.executable, '-m', 'neobert_jax.finetune', f'--workdir={workdir}', *cmd]
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode:
    print(proc.stderr[-3000:], file=sys.stderr)
    raise SystemExit(f'fine-tuning {arm} seed {seed} failed (exit {proc.returncode})')
  results = json.loads((workdir / 'results.json').read_text())
  # The final epoch's test accuracy: no model selection on the split being reported.
  return float(results['final']['metrics']['accuracy'])


def arguments() -> argparse.ArgumentParser:
  """The command line; the fine-tuning settings default to the fine-tuning config's own."""
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--run', required=True, help='a pretraining workdir (its config.json and checkpoints)')
  ap.add_argument('--task', default='fine_food', choices=labelled.TASKS)
  ap.add_argument(
    '--train-csv', default='', help='your own task instead: a text,label CSV to fine-tune on (with --test-csv)'
  )
  ap.add_argument('--test-csv', default='', help='the text,label CSV scored (with --train-csv)')
  ap.add_argument('--seeds', default='0,1,2')
  own = config_lib.load(FINETUNE_CONFIG)  # every default below is the config's own
  ap.add_argument('--epochs', type=int, default=own.train.epochs)
  ap.add_argument('--lr', type=float, default=own.optimizer.lr, help='the rate, quoted for width --lr-width')
  ap.add_argument(
    '--lr-width', type=int, default=own.optimizer.lr_width, help='optimizer.lr_width: 0 uses --lr as given'
  )
  ap.add_argument('--batch-size', type=int, default=own.train.batch_size)
  ap.add_argument('--max-length', type=int, default=own.data.max_length)
  ap.add_argument('--pooling', default='', choices=['', 'cls', 'mean'], help="the head's pooling; '' = the config's")
  ap.add_argument('--out', default='')
  ap.add_argument(
    '--random-cache',
    default='',
    help='a folder keeping the random arm by its fine-tuning command: a later run with the same architecture, '
    'tokenizer, task, seeds and rates reads its scores instead of fine-tuning it again',
  )
  return ap


def main() -> None:
  ap = arguments()
  args = ap.parse_args()
  if bool(args.train_csv) != bool(args.test_csv):
    ap.error('--train-csv and --test-csv go together')
  run = Path(args.run)
  out = Path(args.out or run / 'pretraining_helps')
  out.mkdir(parents=True, exist_ok=True)
  seeds = [int(s) for s in args.seeds.split(',')]
  scores: dict[str, list[float]] = {'pretrained': [], 'random init': []}
  for seed in seeds:
    for arm in scores:
      scores[arm].append(finetune(run, arm.split()[0], seed, args, out))
      print(f'seed {seed} {arm:12s} test accuracy {scores[arm][-1]:.4f}', flush=True)
  stats = {arm: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for arm, v in scores.items()}
  width = json.loads((run / 'config.json').read_text())['model']['hidden_size']
  rate = finetune_config.effective_lr(ml_collections.ConfigDict({'lr': args.lr, 'lr_width': args.lr_width}), width)
  given = f' (--lr {args.lr} quoted for width {args.lr_width})' if args.lr_width > 0 else ''
  task = f'{args.train_csv} -> {args.test_csv}' if args.train_csv else args.task
  print(f'\n{task}, {len(seeds)} seeds, {args.epochs} epochs, lr {rate:g}{given}, batch {args.batch_size}:')
  for arm, (mean, sd) in stats.items():
    print(f'  {arm:12s} {mean:.4f} +- {sd:.4f}   ({", ".join(f"{x:.4f}" for x in scores[arm])})')
  gap = stats['pretrained'][0] - stats['random init'][0]
  spread = max(sd for _, sd in stats.values())
  verdict = 'wins by more than the seed spread' if gap > spread else 'does NOT win by more than the seed spread'
  print(f'  pretrained - random init = {gap:+.4f}; spread {spread:.4f}: pretraining {verdict}')
  (out / 'pretraining_helps.json').write_text(
    json.dumps({'args': vars(args), 'scores': scores, 'gap': gap, 'spread': spread}, indent=2) + '\n'
  )


if __name__ == '__main__':
  main()
