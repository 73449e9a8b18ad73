"""Run the paper's GLUE hyper-parameter grid of fine-tuning jobs and report the best point.

  python -m neobert_jax.finetune.sweep --config=... --workdir=SWEEP
  learning rate {5e-6, 6e-6, 1e-5, 2e-5, 3e-5} x batch {4, 8, 16, 32} x weight decay {1e-2, 1e-5}

--lr / --batch / --weight_decay restrict the grid (comma-separated values). Each point is an ordinary fine-tuning
run in SWEEP/lr<lr>_bs<batch>_wd<wd>; a point whose results.json exists is read back, not re-run, so re-running the
same command resumes an interrupted sweep (a point cut off mid-run is started again). The table of best validation
scores and the best point are printed and written to SWEEP/sweep.json.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

from neobert_jax import commandline, errors, paths
from neobert_jax import config as config_lib

GRID = {'lr': (5e-6, 6e-6, 1e-5, 2e-5, 3e-5), 'batch': (4, 8, 16, 32), 'weight_decay': (1e-2, 1e-5)}
SUMMARY_FILE = 'sweep.json'

_PROG = 'sweep'
_FLAGS = flags.FlagValues()  # this command's own, so importing this module (tests, other commands) adds no absl flags
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Fine-tuning config (configs/finetune_*.py).', flag_values=_FLAGS, lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  'workdir', None, 'Sweep directory: one sub-directory per grid point.', flag_values=_FLAGS
)
_LR = flags.DEFINE_list('lr', [str(v) for v in GRID['lr']], 'Learning rates to try.', flag_values=_FLAGS)
_BATCH = flags.DEFINE_list('batch', [str(v) for v in GRID['batch']], 'Global batch sizes to try.', flag_values=_FLAGS)
_WEIGHT_DECAY = flags.DEFINE_list(
  'weight_decay', [str(v) for v in GRID['weight_decay']], 'Weight decays to try.', flag_values=_FLAGS
)


def point_name(lr: float, batch: int, wd: float) -> str:
  return f'lr{lr:g}_bs{batch}_wd{wd:g}'


def run_sweep(
  cfg: ml_collections.ConfigDict,
  workdir: str | Path,
  lrs: Sequence[float],
  batches: Sequence[int],
  weight_decays: Sequence[float],
) -> dict[str, Any]:
  """Runs (or reads back) every point; returns {'metric', 'rows': [...], 'best': row}."""
  from neobert_jax.finetune import job  # pylint: disable=g-import-not-at-top

  root = paths.resolve(workdir, '--workdir')
  rows = []
  for lr, batch, wd in itertools.product(lrs, batches, weight_decays):
    point = root / point_name(lr, batch, wd)
    results_path = point / job.RESULTS_FILE
    reused = results_path.exists()
    if not reused:
      if point.exists():  # an interrupted point of this sweep: its partial files belong to us, start it again
        point.rmtree()
      point_fields = {'optimizer.lr': float(lr), 'train.batch_size': int(batch), 'optimizer.weight_decay': float(wd)}
      c = config_lib.replace(cfg, {**point_fields, 'export.dir': ''})
      job.finetune(c, point)
    results = json.loads(results_path.read_text())
    metric = results['metric']
    rows.append(
      {
        'lr': lr,
        'batch': batch,
        'weight_decay': wd,
        'metric': metric,
        'best': results['best']['metrics'][metric],
        'best_step': results['best']['step'],
        'final': results['final']['metrics'][metric],
        'workdir': str(point),
        'reused': reused,
      }
    )
  lower = rows[0]['metric'] in job.LOWER_IS_BETTER
  best = (min if lower else max)(rows, key=lambda r: r['best'])
  summary = {'metric': rows[0]['metric'], 'rows': rows, 'best': best}
  paths.write_text(root / SUMMARY_FILE, json.dumps(summary, indent=2) + '\n')
  return summary


def format_table(summary: dict[str, Any]) -> str:
  m = summary['metric']
  lines = [f'{"lr":>8} {"batch":>5} {"wd":>7} {"best " + m:>18} {"step":>6} {"final":>8}']
  for r in summary['rows']:
    mark = ' *' if r is summary['best'] or r == summary['best'] else ''
    lines.append(
      f'{r["lr"]:>8g} {r["batch"]:>5} {r["weight_decay"]:>7g} {r["best"]:>18.4f} {r["best_step"]:>6} '
      f'{r["final"]:>8.4f}{mark}'
    )
  b = summary['best']
  lines.append(
    f'best: lr {b["lr"]:g}, batch {b["batch"]}, weight decay {b["weight_decay"]:g}: {m} {b["best"]:.4f} '
    f'at step {b["best_step"]} ({b["workdir"]})'
  )
  return '\n'.join(lines)


def main(argv: list[str]) -> int:
  del argv  # run() refuses positional arguments
  commandline.configure_logging()
  try:
    grid = ([float(v) for v in _LR.value], [int(v) for v in _BATCH.value], [float(v) for v in _WEIGHT_DECAY.value])
  except ValueError as e:
    raise errors.ConfigError(
      f'--lr / --batch / --weight_decay must be comma-separated numbers ({e}) (see --help)'
    ) from e
  print(format_table(run_sweep(_CONFIG.value, _WORKDIR.value, *grid)))
  return 0


def run() -> None:
  """The command line (neobert_jax/commandline.py), as finetune's: the same config file and overrides."""
  commandline.run_absl(
    _PROG,
    'neobert_jax.finetune.sweep',
    __doc__,
    _FLAGS,
    main,
    required=('config', 'workdir'),
    fields_doc='neobert_jax/config/finetune.py',
  )


if __name__ == '__main__':
  run()
