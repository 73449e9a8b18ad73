"""configs/neobert_250m_stages.py's three stages at the tiny CPU size (configs/tiny_cpu.py): a minute per stage.

Every stage trains with tiny_cpu.py's optimizer: Muon on the layer's matrices, AdamW on the rest.

stage 1  128 tokens, theta 10k, 30% masked, the batch ramped 16 -> 32 sequences over 20k tokens, then constant
stage 2  256 tokens, theta 160k, 15% masked, the moments carried over, a short re-warmup at a lower rate
stage 3  256 tokens, 1 - sqrt decay to 0 over the whole stage, 5% masked, the moments and data position carried

python -m neobert_jax.train --config=configs/tiny_cpu_stages.py:1 --workdir=runs/t1
python -m neobert_jax.train --config=configs/tiny_cpu_stages.py:2 --workdir=runs/t2 --config.init.from_checkpoint=runs/t1
python -m neobert_jax.train --config=configs/tiny_cpu_stages.py:3 --workdir=runs/t3 --config.init.from_checkpoint=runs/t2
"""

import importlib.util
from pathlib import Path

from neobert_jax import config


def _recipe():
  path = Path(__file__).with_name('neobert_250m_stages.py')  # by path: no sys.path needed
  spec = importlib.util.spec_from_file_location('_neobert_250m_stages', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(stage: str = '1'):
  cfg = config.load(Path(__file__).with_name('tiny_cpu.py'))
  cfg = _recipe().apply(cfg, stage, {'2': 'runs/t1', '3': 'runs/t2'}.get(stage, ''))
  t, o = cfg.train, cfg.optimizer
  cfg.eval.at_start = False
  if stage == '1':
    t.num_steps = 300
    o.warmup_steps = 30  # tiny_cpu.py's warmup is a share of its run; the stages count theirs in steps
    t.batch_warmup_start, t.batch_warmup_tokens = 16, 20_000
    cfg.data.max_predictions = 48  # 30% of 128
    return cfg
  cfg.model.max_length = 256
  cfg.data.max_documents_per_row = 32
  t.global_batch_size, t.num_steps = 16, 100
  o.peak_lr, o.muon_lr = 1e-3, 5e-4  # Muon as in tiny_cpu.py (its state carried over), at the main job's ratio
  if stage == '2':
    o.warmup_steps = 10
    cfg.data.max_predictions = 48  # 15% of 256
  else:
    cfg.data.max_predictions = 16  # 5% of 256
  return cfg
