"""The run layout, on disk or on a bucket, and its one owner: WORKDIR/config.json, WORKDIR/tokenizer/ and
WORKDIR/checkpoints/<step>/{params,opt,ema,data,config} (a step set aside is <step>.corrupt; Orbax lists only
committed steps). A missing run or step is FileNotFoundError; opening a source for a user is weights/source.py's."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from neobert_jax import config as config_lib
from neobert_jax import bucket, paths
from neobert_jax.config import finetune as finetune_config
from neobert_jax.config import train as train_config
from neobert_jax.data import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)


def _orbax():
  # Imported on first use: readers of the config alone, and the modules that import this one for its
  # constants, should not pay Orbax's import (~0.4 s) until a checkpoint is opened.
  import orbax.checkpoint  # pylint: disable=g-import-not-at-top

  use_bucket_budget()
  return orbax.checkpoint


@contextlib.contextmanager
def item_metadata_quietly():
  """Silences absl below ERROR while an item's metadata is read: Orbax warns that the item has no metadata of its
  own (it sits one directory up), which only alarms users."""
  absl_log = logging.getLogger('absl')
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    yield
  finally:
    absl_log.setLevel(level)


def use_bucket_budget() -> None:
  """Puts the bucket's retry budget (neobert_jax/bucket.py) into every tensorstore context Orbax builds for its
  arrays (it copies these templates for each one; there is no other knob for them in Orbax 0.12.8)."""
  from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=g-import-not-at-top

  retries = bucket.tensorstore_retries()
  for template in (tensorstore_utils._BASE_TS_CONTEXT, tensorstore_utils._DEFAULT_OCDBT_TS_CONTEXT):
    template['gcs_request_retries'] = dict(retries)


CHECKPOINT_SUBDIR = 'checkpoints'
PARAMS_ITEM = 'params'
OPT_ITEM = 'opt'  # the optimizer state: a step without it (fine-tuning's best step) is not resumable
DATA_ITEM = 'data'  # the data pipeline's position, in its own format
EMA_ITEM = 'ema'  # the moving average of the parameters (train.ema_decay > 0), laid out like them
CONFIG_ITEM = 'config'  # the resolved config, saved with each step as an Orbax JSON item
CONFIG_FILE = 'config.json'  # the same config, written into the workdir when the run starts
METRICS_FILE = 'metrics.jsonl'  # one JSON line per logged step (engine/metrics.py writes it)
REPORT_FILE = 'report.json'  # the end-of-run report's figures (train/report.py), which the model card quotes
CURVE_PLOT = 'loss_curve.png'  # the held-out curve against the baselines (train/report.py)
TOKENIZER_DIR = 'tokenizer'
# The copy's name by the tokenizer file's kind (data/tokenizer.py reads each by its suffix).
_TOKENIZER_NAMES = {'.txt': 'vocab.txt', '.json': 'tokenizer.json', '.model': 'tokenizer.model'}


def save_tokenizer(workdir: paths.Path, spec: str) -> None:
  """Process 0: copies the file `spec` names into WORKDIR/tokenizer/, so the run carries its vocabulary."""
  if jax.process_index() != 0 or not spec:
    return
  try:
    src = paths.resolve(tokenizer_lib.resolve_tokenizer_path(spec))
  except (FileNotFoundError, ValueError):
    return
  name = _TOKENIZER_NAMES.get(os.path.splitext(src.name)[1])
  if name is None:
    return
  folder = paths.resolved(workdir) / TOKENIZER_DIR
  dst = folder / name
  if dst.is_file() and paths.sha256(dst) == paths.sha256(src):
    return
  for other in _TOKENIZER_NAMES.values():  # one tokenizer per run: a copy of another kind is replaced
    if other != name and (folder / other).is_file():
      (folder / other).unlink()
  folder.mkdir(parents=True, exist_ok=True)
  paths.write_bytes(dst, src.read_bytes())


def tokenizer_copy(workdir: str | os.PathLike) -> str:
  """A local path to the tokenizer the run carries (a bucket's copy is cached here); '' when it has none."""
  folder = paths.resolve(workdir) / TOKENIZER_DIR
  found = [folder / n for n in _TOKENIZER_NAMES.values() if (folder / n).is_file()] if folder.is_dir() else []
  return str(paths.local_copy(found[0])) if found else ''


def checkpoint_dir(path: str | os.PathLike) -> paths.Path:
  """Accepts a workdir (with a checkpoints/ subdir) or the checkpoints dir itself, local or on a bucket."""
  p = paths.resolve(path)
  return p / CHECKPOINT_SUBDIR if (p / CHECKPOINT_SUBDIR).is_dir() else p


def checkpoint_steps(path: str | os.PathLike) -> list[int]:
  """The complete steps (Orbax lists only finalised steps: a half-written one is never returned)."""
  return list(_orbax().utils.checkpoint_steps(checkpoint_dir(path)))


def latest_step(path: str | os.PathLike) -> int | None:
  """The newest complete step."""
  return max(checkpoint_steps(path), default=None)


def step_dir(path: str | os.PathLike, step: int) -> paths.Path:
  """Where step `step` of a run lives (`path`: its workdir or checkpoints dir)."""
  return checkpoint_dir(path) / str(step)


def set_aside(path: str | os.PathLike, step: int, what: str) -> int | None:
  """The one policy for a step whose bytes cannot be read: said loudly, renamed `<step>.corrupt` by process 0
  (nothing deleted), and the next older complete step returned (None when none is left)."""
  cdir = checkpoint_dir(path)
  fallback = max((s for s in checkpoint_steps(cdir) if s < step), default=None)
  then = f'falling back to step {fallback}' if fallback is not None else 'no older checkpoint is left'
  log.error('checkpoint step %d in %s: %s; %s', step, cdir, what, then)
  src = cdir / str(step)
  if jax.process_index() == 0 and src.exists():
    dst = src.with_name(f'{step}.corrupt')
    n = 1
    while dst.exists():
      dst, n = src.with_name(f'{step}.corrupt{n}'), n + 1
    src.rename(dst)
    log.error(
      'CHECKPOINT SET ASIDE: step %d at %s could not be read. It was renamed to %s (nothing was deleted); '
      'inspect it, or delete it once you no longer need it.',
      step,
      src,
      dst,
    )
  return fallback


def typed_record(recorded: Any) -> ml_collections.ConfigDict:
  """A recorded run config (a dict or ConfigDict) typed by its run's schema (config.from_record): fine-tuning's
  when it names a task, else pretraining's."""
  task = recorded.get('task')
  schema = finetune_config.base_config(task) if task in finetune_config.TASKS else train_config.get_config()
  return config_lib.from_record(recorded, schema)


def read_config(path: str | os.PathLike, step: int | None = None) -> ml_collections.ConfigDict:
  """The resolved config saved with `step` (default: latest), else the workdir's config.json, typed by its schema.
  Read on this process alone: a Checkpointer would wait at a barrier for processes that may not be reading."""
  cdir = checkpoint_dir(path)
  step = latest_step(cdir) if step is None else step
  looked = []
  if step is not None:
    item = step_dir(cdir, step) / CONFIG_ITEM
    looked.append(str(item))
    if item.is_dir():
      return typed_record(_orbax().JsonCheckpointHandler().restore(item))
  # Runs whose steps hold no config item (fine-tuning runs) record it in the workdir only.
  for c in (cdir.parent / CONFIG_FILE, cdir / CONFIG_FILE):
    looked.append(str(c))
    if c.is_file():
      return typed_record(json.loads(c.read_text()))
  raise FileNotFoundError(f'no training config found for {path} (looked at {", ".join(looked)})')


def eval_prefix(item: str) -> str:
  """metrics.jsonl's prefix of the held-out figures of the weights `item`: 'eval' for the parameters, 'eval/ema' for
  their moving average (train/pretraining.HeldOut writes them; loss_curve and the benchmarks read them)."""
  return 'eval' if item == PARAMS_ITEM else f'eval/{item}'


def exported_item(run_config: ml_collections.ConfigDict) -> str:
  """The weights a run ships, which its report, probe, model card and every later start from it read: the moving
  average with export.use_ema, else the parameters."""
  export = run_config.get('export') or {}
  return EMA_ITEM if export.get('use_ema', False) else PARAMS_ITEM


def params_item(path: str | os.PathLike, step: int | None, name: str = PARAMS_ITEM) -> tuple[paths.Path, int]:
  """(the item's directory, its step) of `step` (None or < 0: the latest; `name`: PARAMS_ITEM or EMA_ITEM)."""
  cdir = checkpoint_dir(path)
  step = latest_step(cdir) if step is None or step < 0 else step
  if step is None:
    raise FileNotFoundError(f'no complete checkpoint under {cdir}')
  item = step_dir(cdir, step) / name
  if not item.is_dir():
    if name == EMA_ITEM:
      raise FileNotFoundError(f'checkpoint step {step} holds no EMA of the weights (the run had train.ema_decay=0)')
    raise FileNotFoundError(f'checkpoint step {step} has no params at {item}')
  return item, step


def restore_opt_tree(path: str | os.PathLike, step: int, abstract: Any) -> Any:
  """The optimizer state of a run's `step`, read straight onto `abstract`'s shardings (a new stage that keeps
  another run's optimizer, init.keep_optimizer). Every process must call it: Orbax reads collectively."""
  with _orbax().StandardCheckpointer() as ckptr:
    return ckptr.restore(step_dir(path, step) / OPT_ITEM, abstract)


def restore_param_tree(
  path: str | os.PathLike, step: int | None, abstract: Any, name: str = PARAMS_ITEM
) -> tuple[Any, int]:
  """(nested params, step) read straight onto `abstract`'s shardings (`name`: PARAMS_ITEM or EMA_ITEM); collective:
  every process must call it."""
  item, step = params_item(path, step, name)
  with _orbax().StandardCheckpointer() as ckptr:
    return ckptr.restore(item, abstract), step


def restore_params(
  path: str | os.PathLike, step: int | None = None, name: str = PARAMS_ITEM
) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
  """(model config, {dotted key: numpy array}) of a checkpoint's step (default: the latest), on one CPU device
  whatever mesh wrote it; `name`=EMA_ITEM reads the moving average."""
  item, step = params_item(path, step, name)
  cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend='cpu')[0])
  with _orbax().StandardCheckpointer() as ckptr:
    with item_metadata_quietly():
      meta = ckptr.metadata(item).item_metadata
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu), meta.tree)
    tree = ckptr.restore(item, target)
  flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep='.').items()}
  return read_config(item.parent.parent, step).model, flat


# metrics.jsonl's keys -> loss_curve's columns (tokens_seen: what the model card says was seen)
_TRAIN_COLUMNS = {'time': 'time', 'train/loss': 'train', 'train/tokens_seen': 'tokens_seen'}


def loss_curve(workdir: str | os.PathLike, item: str = PARAMS_ITEM) -> list[dict[str, Any]]:
  """Rows {step, time, train, tokens_seen, eval, eval_accuracy} from metrics.jsonl (a resumed run's later lines win;
  `time` is unix seconds, absent in files written before the field existed). `item`=EMA_ITEM: eval and
  eval_accuracy are the moving average's (eval/ema/*) and the parameters' loss is params_eval."""
  held = eval_prefix(item)
  columns = {**_TRAIN_COLUMNS, f'{held}/loss': 'eval', f'{held}/accuracy': 'eval_accuracy'}
  if item != PARAMS_ITEM:
    columns[f'{eval_prefix(PARAMS_ITEM)}/loss'] = 'params_eval'
  rows: dict[int, dict[str, Any]] = {}
  path = paths.Path(workdir) / METRICS_FILE
  if not path.is_file():
    return []
  for line in path.read_text().splitlines():
    if not line.strip():
      continue
    rec = json.loads(line)
    row = rows.setdefault(int(rec['step']), {'step': int(rec['step'])})
    row.update({name: rec[key] for key, name in columns.items() if key in rec})
    for key, value in rec.items():  # eval/probe/<task>/accuracy and, once, .../random_init_accuracy
      if key.startswith('eval/probe/'):
        row[key.removeprefix('eval/')] = value
      elif key.count('/') == 2 and key.endswith('/loss') and not key.startswith('eval/ema/'):
        row[key.removeprefix('eval/')] = value  # a mixture's sources: eval/<name>/loss
  return [rows[s] for s in sorted(rows)]
