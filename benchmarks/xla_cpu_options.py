"""XLA:CPU compiler options on the main job's train step: each option compiles the same lowered step, and the
compiled programs take turns step by step in one process, so machine load hits them alike.

python -m benchmarks.xla_cpu_options [--dtype float32|bfloat16] [--only default,ynn_off,...] [--steps 30]
    [--variant NAME=field=value,field=value ...]

The step is configs/tiny_cpu.py's (1 x 128, 32 rows of 128 tokens, vocab 2048, Muon or AdamW as the recipe says),
on one device, with synthetic rows at the recipe's 40% mask rate. Each option is an XLA DebugOptions field passed to
`Lowered.compile(compiler_options)`, the per-program form of an XLA_FLAGS entry; `autodiff_attention` instead traces
the step with autodiff's attention backward in place of the 'xla' kernel's own. It prints the median and fastest
step of each option and its speed against the first (`default`: no option), plus the loss after the last step: the
options that change the numerics show it in the last digits. Each `--variant` adds the step of the main job's config
with those fields changed (e.g. `fp32_logits=model.logits_dot_in_fp32=True`), compiled with no option, taking turns
with the rest on the same rows.

A script, not part of the library (nothing imports it): run it from the repository root.
"""

from __future__ import annotations

import argparse
import ast
import time
from unittest import mock

import jax
import numpy as np

from neobert_jax import config, sharding as shd
from neobert_jax.config import train as train_config
from neobert_jax.engine import step as engine_step
from neobert_jax.model import attention as attention_lib
from tests.support.attention_reference import plain_attention
from neobert_jax.train import mlm
from tests.support.tiny_train import mlm_rows

# name -> DebugOptions fields
OPTIONS: dict[str, dict] = {
  'default': {},
  'ynn_off': {'xla_cpu_experimental_ynn_fusion_type': ''},  # no YNNPACK fusions: Eigen's dots and XLA's loops
  'emitters_off': {'xla_cpu_use_fusion_emitters': False},  # the test suite's fast-compile setting
  'onednn': {'xla_cpu_use_onednn': True, 'xla_cpu_experimental_onednn_custom_call': True},
  'xnnpack': {'xla_cpu_use_xnnpack': True},
  'fast_math': {'xla_cpu_enable_fast_math': True},
  'vector_width_256': {'xla_cpu_prefer_vector_width': 256},
}
# name -> a context under which the same step is traced differently (compiled with no option): the 'xla' attention
# kernel with autodiff's backward (tests/support/attention_reference.py) in place of its hand-written one
TRACED = {'autodiff_attention': lambda: mock.patch.object(attention_lib, 'xla_attention', plain_attention)}


def main_job_config(dtype: str, overrides: str = ''):
  """configs/tiny_cpu.py resolved, with `dtype` and the 'field=value,...' `overrides` (a value is read as a Python
  literal when it is one: True, 8, 1e-2; else kept as text) applied through config.load."""
  fields = {'model.dtype': dtype, 'data.dir': 'unused'}  # the step needs no data; resolution wants one named
  for item in filter(None, overrides.split(',')):
    field, value = item.split('=', 1)
    try:
      fields[field] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      fields[field] = value
  return train_config.resolve_train(config.load('configs/tiny_cpu.py', fields))[0]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
  ap.add_argument('--only', default='', help='comma-separated option names (default: all); the first is the baseline')
  ap.add_argument('--steps', type=int, default=30)
  ap.add_argument('--variant', action='append', default=[], help='NAME=field=value,...: the step of a changed config')
  args = ap.parse_args()
  names = args.only.split(',') if args.only else [*OPTIONS, *TRACED]
  cfg = main_job_config(args.dtype)
  mesh = shd.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  defs, state = mlm.create_train_state(cfg, mesh)
  sharding = engine_step.micro_batch_sharding(mesh)

  def synthetic_batches(c):  # a config's own rows: a variant may change the batch or the row length
    rows = [mlm_rows(c, seed=i, fraction=c.data.mask_rate) for i in range(4)]
    return [{k: jax.device_put(r[k][None], sharding) for k in mlm.batch_keys(c.data.max_predictions)} for r in rows]

  batches = dict.fromkeys(names, synthetic_batches(cfg))
  lowered = mlm.jit_mlm_train_step(cfg, mesh, defs).lower(state, batches[names[0]][0])
  steps, states = {}, {}
  for name in names:
    if name in TRACED:
      with TRACED[name]():
        steps[name] = mlm.jit_mlm_train_step(cfg, mesh, defs).lower(state, batches[name][0]).compile()
    else:
      steps[name] = lowered.compile(OPTIONS[name])
    states[name] = jax.tree.map(lambda a: a.copy(), state)  # each side owns its state: the step donates it
  for variant in args.variant:
    name, overrides = variant.split('=', 1)
    changed = main_job_config(args.dtype, overrides)
    changed_defs, states[name] = mlm.create_train_state(changed, mesh)
    batches[name] = synthetic_batches(changed)
    steps[name] = mlm.jit_mlm_train_step(changed, mesh, changed_defs).lower(states[name], batches[name][0]).compile()
    names.append(name)
  times: dict[str, list[float]] = {n: [] for n in names}
  losses: dict[str, float] = {}
  warmup = 3
  for i in range(args.steps + warmup):
    for name in names:
      start = time.perf_counter()
      with shd.activate(mesh):
        states[name], metrics = steps[name](states[name], batches[name][i % 4])
      losses[name] = float(metrics['loss'])  # blocks until the step is done
      if i >= warmup:
        times[name].append(time.perf_counter() - start)
  base = float(np.median(times[names[0]]))
  print(f'main job step, {args.dtype}, {args.steps} steps each, interleaved')
  print('| option | median ms | fastest ms | speed | loss after the last step |')
  print('|---|---:|---:|---:|---:|')
  for name in names:
    median = float(np.median(times[name]))
    print(f'| {name} | {median * 1e3:.1f} | {min(times[name]) * 1e3:.1f} | {base / median:.3f}x | {losses[name]:.5f} |')


if __name__ == '__main__':
  main()
