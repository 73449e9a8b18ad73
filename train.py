#!/usr/bin/env python3
"""Pretrain NeoBERT: python train.py --config=configs/neobert_250m.py --workdir=runs/stage1 [--config.a.b=value ...]

Only the entry point: the same command as `python -m neobert_jax.train` and `neobert-train` (the trainer lives in
neobert_jax/train/). Re-running the same command resumes from the workdir's latest checkpoint; --help lists
every flag, --debug shows the traceback of an expected error.
"""

from neobert_jax.train.__main__ import run

if __name__ == '__main__':
  run()
