"""What a run continues from: its own recorded config, checked by config/resume.py's table before anything is
touched, or another run's (a new stage); docs/configuration.md, resuming with a changed config; stages."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
from typing import Any

import jax
import ml_collections

from neobert_jax import errors, paths
from neobert_jax import config as config_lib
from neobert_jax.config import resume as resume_rules
from neobert_jax.errors import ConfigError
from neobert_jax.config import train as train_config
from neobert_jax.engine import optimizer as optimizer_lib
from neobert_jax.engine.session import check_workdir
from neobert_jax.weights import runs
from neobert_jax.weights.source import Source

log = logging.getLogger('neobert_jax.train')
HISTORY_FILE = 'config_history.jsonl'


@dataclasses.dataclass
class Plan:
  """What `check` found: the recorded config (None for a new run), the step it belongs to, accepted changes."""

  workdir: paths.Path
  recorded: dict[str, Any] | None = None
  step: int | None = None  # the latest checkpoint's step (None: the workdir has none)
  changes: list[resume_rules.Change] = dataclasses.field(default_factory=list)
  origin: dict[str, Any] | None = None  # a new run's source and what it changed from it (check_stage)


def _recorded(workdir: paths.Path) -> tuple[dict[str, Any] | None, int | None]:
  """(the run's recorded config, its latest checkpoint step); a step whose config copy cannot be read is set
  aside (runs.set_aside) and the previous one used."""
  step = runs.latest_step(workdir) if (workdir / runs.CHECKPOINT_SUBDIR).is_dir() else None
  if step is None and not (workdir / runs.CONFIG_FILE).is_file():
    return None, None
  while True:
    try:
      return runs.read_config(workdir, step).to_dict(), step
    except FileNotFoundError:  # a run from before configs were recorded: only its arrays can be checked
      log.warning(
        "%s holds checkpoints but no recorded config: this config cannot be compared with the run's; "
        "the checkpoint's array shapes will be checked against it instead",
        workdir,
      )
      return None, step
    except (OSError, ValueError) as e:
      if step is None:  # an unreadable WORKDIR/config.json: the run cannot be checked, so it is not touched
        raise ConfigError(
          f'{workdir} holds a run whose recorded config cannot be read ({e}); resume refused and '
          'nothing changed. Fix it, or pass a new --workdir.'
        ) from None
      if isinstance(e, ConfigError):
        raise
      step = runs.set_aside(workdir, step, f'its copy of the config could not be read ({errors.one_line(e)})')


def check_resume(cfg: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Plan:
  """The resume plan for the resolved `cfg` in `workdir`; ConfigError when the workdir's run is not this one."""
  workdir = paths.resolved(workdir, '--workdir')
  check_workdir(workdir)
  recorded, step = _recorded(workdir)
  if recorded is None:
    return Plan(workdir, None, step)
  changes = _changes(recorded, cfg)
  identity = resume_rules.of_kind(changes, resume_rules.IDENTITY) + _restructuring(changes)
  if step is None:  # config.json but no checkpoint: nothing to lose; the new config replaces it, on the record
    if changes:
      log.warning(
        '%s has a config.json but no checkpoint: starting afresh with this config (%d field(s) '
        'differ: %s); the previous config is kept in %s',
        workdir,
        len(changes),
        '; '.join(c.describe() for c in changes),
        HISTORY_FILE,
      )
    return Plan(workdir, recorded, None, changes)
  if identity:
    raise ConfigError(
      f'{workdir} holds a run (checkpoint step {step}) that this config does not continue: '
      f'{"; ".join(c.describe() for c in identity)}. These fields define what the checkpoint is, so resume is '
      f'refused and nothing in the workdir was changed. Fix: run the command that started it (its config is '
      f'{workdir / runs.CONFIG_FILE}), or train the new config in a new --workdir, adding '
      f"--config.init.from_checkpoint={workdir} to start from this run's weights."
    )
  num_steps = cfg.train.num_steps
  if num_steps < step:
    raise ConfigError(
      f'train.num_steps={num_steps} is below the checkpoint step {step} in {workdir}: the run '
      'cannot go back. Fix: keep train.num_steps at or above it (raise it to train further).'
    )
  for line in describe_changes(changes, recorded, cfg, step):
    log.warning('resume with a changed config: %s', line)
  return Plan(workdir, recorded, step, changes)


# Schedule fields that change the learning rate (the others change the update rule, not the rate).
_LR_FIELDS = (
  'train.num_steps',
  'optimizer.peak_lr',
  'optimizer.warmup_steps',
  'optimizer.warmup_init_fraction',
  'optimizer.decay_fraction',
  'optimizer.decay_steps',
  'optimizer.final_lr_fraction',
  'optimizer.wsd_decay_fraction',
  'optimizer.decay_shape',
)


def _restructuring(changes: list[resume_rules.Change]) -> list[resume_rules.Change]:
  """Clipping switched on or off changes the optimizer state's tree: refused like an identity change."""
  return [
    dataclasses.replace(c, kind=resume_rules.IDENTITY)
    for c in changes
    if c.field == 'optimizer.clip_norm' and isinstance(c.before, (int, float)) and (c.before > 0) != (c.after > 0)
  ]


def _decay_note(opt: ml_collections.ConfigDict, num_steps: int) -> str:
  """Where the new schedule decays, in words."""
  if opt.schedule == 'cosine':
    return f'the cosine now reaches its floor at step {optimizer_lib.floor_step(opt, num_steps)} of {num_steps}'
  if opt.schedule == 'constant':
    return 'the rate stays at the peak'
  first, _ = train_config.decay_window(opt, num_steps)
  return f'the {opt.schedule} decay now runs from step {first} to the floor at the last update, step {num_steps - 1}'


def describe_changes(
  changes: list[resume_rules.Change], recorded: dict[str, Any], cfg: ml_collections.ConfigDict, step: int
) -> list[str]:
  """One line per accepted change, saying what it does from `step` on."""
  lines = [f'{c.describe()} ({c.kind})' for c in changes]
  fields = {c.field for c in changes}
  if fields & set(_LR_FIELDS):
    past = config_lib.from_record(recorded, train_config.get_config())  # the record, typed by the schema
    old, new = (float(optimizer_lib.lr_values(c.optimizer, c.train.num_steps, [step])[0]) for c in (past, cfg))
    lines.append(
      f'the learning-rate schedule is recomputed from the new config: the next update (step {step}) '
      f'uses {new:.4g} where the old schedule gave {old:.4g}; {_decay_note(cfg.optimizer, cfg.train.num_steps)}'
      + (' (a jump: consider warming up again in a new run)' if old > 0 and new > 1.5 * old else '')
    )
  if 'train.global_batch_size' in fields:
    lines.append(
      f'rows per step {recorded["train"]["global_batch_size"]} -> {cfg.train.global_batch_size}: the '
      'data continues at the next unseen row of the same stream; steps (and the schedule) count '
      'optimizer updates, so each remaining step now sees the new number of rows'
    )
  if 'train.grad_accum_steps' in fields and 'train.global_batch_size' not in fields:
    lines.append(
      'the same global batch, split into another number of micro-batches (token-weighted: the '
      'update is the same up to float rounding)'
    )
  return lines


def record(plan: Plan, cfg: ml_collections.ConfigDict, step: int) -> None:
  """Process 0: WORKDIR/config.json, the copy of its tokenizer and one history line for this start or resume."""
  if jax.process_index() != 0:
    return
  entry = {
    'time': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
    'step': int(step),
    'event': 'start' if plan.step is None else 'resume',
    'changes': [c.to_json() for c in plan.changes],
  }
  if plan.step is None and plan.origin is not None:
    entry['origin'] = plan.origin  # a new stage: where it started and what it changed
  if plan.step is None and plan.recorded is not None and plan.changes:
    entry['replaced_config'] = plan.recorded  # a config.json without checkpoints, kept before it is replaced
  paths.append_line(plan.workdir / HISTORY_FILE, json.dumps(entry, default=str, sort_keys=True))
  train_config.write_config(cfg, plan.workdir)
  runs.save_tokenizer(plan.workdir, cfg.data.tokenizer)  # the run carries its vocabulary (weights/runs.py)


# The fields that lay out the training row stream: the data position of one run means the same rows in another only
# when these agree (the mask rate and the batch size may differ: masks are drawn per row, steps take whole rows).
STREAM_FIELDS = (
  'seed',
  'model.max_length',
  'data.dir',
  'data.tokenizer',
  'data.packing',
  'data.max_documents_per_row',
  'data.shuffle_seed',
  'data.block_docs',
  'data.shuffle_window',
  'data.virtual_shards',
)

# The fields that decide the optimizer state's tree: init.keep_optimizer carries it over only when these agree.
OPTIMIZER_FIELDS = ('optimizer.name', 'optimizer.muon_adamw')


def check_stage(cfg: ml_collections.ConfigDict, src: Source | None) -> dict[str, Any] | None:
  """The origin of a run from `src` for its history; refuses a carry-over this run lays out anew."""
  if src is None:
    return None
  if src.kind != 'run':
    return {'from_hf': src.where}
  recorded = src.run_config.to_dict()
  init = cfg.init
  changes = _changes(recorded, cfg)
  if init.continue_data:
    _refuse_any(
      changes,
      STREAM_FIELDS,
      f'init.continue_data=True continues the row stream of {src.where} (step {src.step}), but this run lays out '
      'another',
      "keep those fields as the source has them, or set init.continue_data=False to read this run's data from its "
      'start',
    )
  if init.keep_optimizer:
    _refuse_any(
      changes,
      OPTIMIZER_FIELDS,
      f'init.keep_optimizer=True carries the optimizer state of {src.where} (step {src.step}) over, but this run '
      'builds another optimizer',
      "set init.keep_optimizer=False to start this run's optimizer afresh, or keep those fields as the source has them",
    )
  return {
    'from_checkpoint': src.where,
    'step': src.step,
    'keep_optimizer': bool(init.keep_optimizer),
    'continue_data': bool(init.continue_data),
    'changes': [c.to_json() for c in changes if c.kind != resume_rules.FREE],
  }


def stream(cfg: ml_collections.ConfigDict, src: Source | None) -> dict[str, Any]:
  """With init.continue_data, the source run's row-stream layout, for the fields this run leaves unset; else {}."""
  if src is None or src.kind != 'run' or not cfg.init.continue_data:
    return {}
  data = src.run_config.to_dict()['data']
  return {k: data[k] for k in ('virtual_shards', 'mixture_block_docs') if k in data}


def _refuse_any(changes: list[resume_rules.Change], fields: tuple[str, ...], problem: str, fix: str) -> None:
  """One line naming the problem, each of `fields` that changed with both values, and the fix; None if none did."""
  moved = [c for c in changes if c.field in fields]
  if moved:
    raise ConfigError(f'{problem}: {"; ".join(c.describe() for c in moved)}. Fix: {fix}')


def _changes(recorded: dict[str, Any], cfg: ml_collections.ConfigDict) -> list[resume_rules.Change]:
  """The differences from the source run's config, classified as a resume would classify them."""
  return resume_rules.diff(recorded, cfg.to_dict(), resume_rules.PRETRAIN_RULES, train_config.get_config().to_dict())
