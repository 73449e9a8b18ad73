"""Where a model's weights come from: a run directory or a Hugging Face NeoBERT directory, local or on a bucket; the
one way every command opens one. Every problem is one CheckpointError naming the setting and the fix (a tokenizer of
another vocabulary is a DataError); opening reads only small files, weights on first use."""

from __future__ import annotations

import dataclasses
import functools
import os
import json
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from neobert_jax import errors, paths
from neobert_jax.data import tokenizer as tokenizer_lib
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import hf, runs

DEFAULT_TOKENIZER = tokenizer_lib.BUILTIN_BERT
# Fields that change parameter shapes or the set of parameters (weights/flat.py); the rest (max_length, dtype,
# attention kernel, remat) may differ.
SHAPE_FIELDS = (
  'vocab_size',
  'hidden_size',
  'num_layers',
  'num_heads',
  'intermediate_size',
  'use_bias',
  'tie_word_embeddings',
)
_FIX = (
  'give the workdir (or its checkpoints/) of a run that saved at least one step, or a Hugging Face NeoBERT '
  'directory (config.json + model.safetensors or pytorch_model.bin)'
)


@dataclasses.dataclass
class Source:
  """An opened source. `where` is the path as given, `path` where it is read (a bucket's HF directory: a local copy,
  made when its files are first needed)."""

  what: str  # the setting that named it, for messages ('init.from_hf', '--model')
  where: str
  path: paths.Path
  kind: str  # 'run' or 'hf'
  step: int | None  # a run's step (resolved: never None for a run)
  model_cfg: ml_collections.ConfigDict  # architecture of the weights, typed
  run_config: ml_collections.ConfigDict | None  # the run's resolved config, typed (None for an HF directory)
  need_decoder: bool  # an MLM decoder is required; else an HF save without one gets a fresh one
  item: str = runs.PARAMS_ITEM  # a run's weights: its parameters or their moving average (runs.exported_item)

  def _fail(self, problem: Any) -> errors.CheckpointError:
    return errors.CheckpointError(f'{self.what}={self.where!r}: {errors.one_line(problem)}')

  @functools.cached_property
  def local(self) -> paths.Path:
    """A local path to the files (an HF directory on a bucket is copied once; a run is read where it is)."""
    if self.kind == 'run' or not paths.is_url(self.path):
      return self.path
    try:
      return paths.local_copy(self.path, marker='config.json')
    except FileNotFoundError as e:
      raise self._fail(e) from None

  @functools.cached_property
  def tokenizer(self) -> str:
    """The tokenizer spec the weights were trained with ('' if unknown: the default applies)."""
    if self.kind == 'hf':
      return next((str(self.local / n) for n in ('tokenizer.json', 'vocab.txt') if (self.local / n).is_file()), '')
    return run_tokenizer(self.run_config, self.path)

  @functools.cached_property
  def flat(self) -> dict[str, np.ndarray]:
    """The weights as flat host arrays ('encoder.*', maybe 'decoder.*', a fine-tuned head's), read once."""
    try:
      if self.kind == 'hf':
        _, flat = hf.read_hf_dir(self.local, init_missing_decoder=not self.need_decoder)
      else:
        _, flat = runs.restore_params(self.path, self.step, self.item)
    except (FileNotFoundError, errors.ExportError) as e:
      raise self._fail(e) from None
    if self.need_decoder and 'decoder.bias' not in flat:  # a tied decoder has no kernel of its own
      raise self._fail(
        'these weights have no MLM decoder (a fine-tuned model?); use a pretraining run or a NeoBERT MLM export'
      )
    return flat

  def read(self) -> 'Source':
    """Reads the weights now (once), so that a problem with them is reported before anything is written."""
    _ = self.flat
    return self

  def check_fits(self, model_cfg: ml_collections.ConfigDict) -> None:
    """CheckpointError when the weights' shapes differ from `model_cfg`'s (numerics and lengths may differ)."""
    diff = {
      f: (self.model_cfg[f], model_cfg[f])
      for f in SHAPE_FIELDS
      if f in self.model_cfg and self.model_cfg[f] != model_cfg[f]
    }
    if diff:
      raise self._fail(f'cannot initialise from it: model fields differ (source, this run): {diff}')

  def sharded(self, like: Any) -> Any:
    """The weights as params sharded like `like` (an nnx.State of arrays or ShapeDtypeStructs). A run's step is
    restored straight onto the shardings; flat weights are placed shard by shard. Every process must call it."""
    if self.kind == 'hf' or 'flat' in self.__dict__:
      return flat_lib.params_from_flat(self.flat, like)
    abstract = nnx.to_pure_dict(
      jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), like)
    )
    try:
      tree, _ = runs.restore_param_tree(self.path, self.step, abstract, self.item)
    except FileNotFoundError as e:
      raise self._fail(e) from None
    params = jax.tree.map(lambda a: a, like)
    nnx.replace_by_pure_dict(params, tree)
    return params


def _hf_config(path: paths.Path) -> dict[str, Any] | None:
  """An HF directory's config.json (it names a model_type; a run's config.json has sections instead), else None."""
  cfg = path / 'config.json'
  if not cfg.is_file() or (path / runs.CHECKPOINT_SUBDIR).is_dir():
    return None
  try:
    content = json.loads(cfg.read_text())
  except ValueError:
    return None
  return content if isinstance(content, dict) and 'model_type' in content else None


def open_source(
  path: str, step: int | None = None, *, need_decoder: bool = False, what: str = '--model', raw: bool = False
) -> Source:
  """Opens a run directory (its latest step, or `step`) or a Hugging Face NeoBERT directory; CheckpointError with
  one line naming `what` when it is neither, or holds no usable weights. A run gives the weights it ships (the
  moving average when it set export.use_ema; `raw`: its parameters, as a stage keeping its optimizer needs)."""
  p = paths.resolve(path, what)

  def fail(problem: str) -> errors.CheckpointError:
    return errors.CheckpointError(f'{what}={path!r}: {problem}; {_FIX}')

  if not p.is_dir():
    raise fail('no such directory' if not p.exists() else 'a file, not a directory')
  hf_config = _hf_config(p)
  if hf_config is not None:
    try:
      model_cfg = hf.model_config_from_hf(hf_config)
    except errors.ExportError as e:
      raise errors.CheckpointError(f'{what}={path!r}: {errors.one_line(e)}') from None
    if not any((p / name).is_file() for name in hf.WEIGHT_FILES):
      raise fail(f'a Hugging Face config.json without weights ({", ".join(hf.WEIGHT_FILES)})')
    return Source(what, str(path), p, 'hf', None, model_cfg, None, need_decoder)
  try:
    _, step = runs.params_item(p, step)  # None or < 0: the latest
    run_config = runs.read_config(p, step)
    item = runs.PARAMS_ITEM if raw else runs.exported_item(run_config)
    runs.params_item(p, step, item)  # a step saved without its moving average: one line now
  except (FileNotFoundError, ValueError) as e:
    raise fail(str(e)) from None
  return Source(what, str(path), p, 'run', step, run_config.model, run_config, need_decoder, item)


def from_init(
  from_checkpoint: str, from_hf: str, step: int = -1, *, need_decoder: bool = False, raw: bool = False
) -> Source | None:
  """The source a config's init section names (from_checkpoint at `step`, -1 = latest, or from_hf), or None."""
  if from_checkpoint:
    return open_source(from_checkpoint, step, need_decoder=need_decoder, what='init.from_checkpoint', raw=raw)
  if from_hf:
    return open_source(from_hf, need_decoder=need_decoder, what='init.from_hf')
  return None


def run_tokenizer(run_config: ml_collections.ConfigDict, workdir: str | paths.Path | None = None) -> str:
  """A run's tokenizer: the copy the run carries, else the one its config records, else the one its prepared data
  was made with ('' if unknown)."""
  carried = runs.tokenizer_copy(runs.checkpoint_dir(workdir).parent) if workdir is not None else ''
  if carried:
    return carried
  data = run_config.data
  if data.tokenizer or 'dir' not in data:  # fine-tuning runs always record theirs
    return data.tokenizer
  if not data.dir:
    return DEFAULT_TOKENIZER  # the built-in corpus is prepared with bert-base-uncased unless data.tokenizer names one
  from neobert_jax.data import shards  # pylint: disable=g-import-not-at-top

  try:
    return shards.Manifest.read(os.fspath(paths.resolve(data.dir))).spec
  except errors.DataError:
    return ''  # data no longer on this machine: the default (bert-base-uncased) applies


def resolve_tokenizer(requested: str, source: Source | None) -> tokenizer_lib.Tokenizer:
  """The tokenizer to use: the requested one, else the source's, else bert-base-uncased; checked against the
  weights' vocabulary so a model is never fed ids from another vocabulary (DataError)."""
  spec = requested or (source.tokenizer if source is not None else '') or DEFAULT_TOKENIZER
  try:
    tok = tokenizer_lib.load_tokenizer(spec)
  except (FileNotFoundError, ValueError) as e:
    raise errors.DataError(f'tokenizer {spec!r}: {e}') from None
  if source is None:
    return tok
  vocab = source.model_cfg.vocab_size
  if tok.vocab_size != vocab:
    raise errors.DataError(
      f'{source.where}: the weights have a {vocab}-token vocabulary but tokenizer {spec!r} has {tok.vocab_size} '
      'tokens; these weights come from another vocabulary: use the tokenizer they were pretrained with '
      '(--config.data.tokenizer=...) or a checkpoint of this vocabulary'
    )
  if requested and source.tokenizer and source.tokenizer != requested:
    own = tokenizer_lib.load_tokenizer(source.tokenizer)
    if not tokenizer_lib.same_vocabulary(own.identity(), tok.identity()):
      raise errors.DataError(
        f'{source.where}: pretrained with tokenizer {source.tokenizer!r}, whose vocabulary '
        f'differs from {requested!r}; drop --config.data.tokenizer to use the pretraining '
        'tokenizer'
      )
  return tok
