"""Where a downstream job's weights and tokenizer come from: a pretraining run, a fine-tuning run or an HF directory.

Reading goes through the project's own readers (train/checkpoint.restore_params for Orbax runs, model/hf_layout
for Hugging Face NeoBERT directories); this module only decides which one applies, which tokenizer belongs to the
weights, and refuses a tokenizer whose vocabulary the weights were not trained with.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from neobert_jax import paths
from neobert_jax.data import tokenizer as tokenizer_lib
from neobert_jax.errors import DataError

DEFAULT_TOKENIZER = tokenizer_lib.BUILTIN_BERT


@dataclasses.dataclass
class Source:
  model_cfg: ml_collections.ConfigDict   # architecture of the weights
  flat: dict[str, np.ndarray]            # flat params ('encoder.*', maybe 'decoder.*', 'dense.*', ...)
  tokenizer: str                         # tokenizer spec that belongs to the weights ('' if unknown)
  run_config: dict[str, Any]             # the run's config.json ({} for an HF directory)
  where: str


def _is_hf_dir(path: Path) -> bool:
  cfg = path / 'config.json'
  return cfg.is_file() and json.loads(cfg.read_text()).get('model_type') == 'neobert'


def _hf_tokenizer(path: Path) -> str:
  for name in ('tokenizer.json', 'vocab.txt'):
    if (path / name).is_file():
      return str(path / name)
  return ''


def load(path: str, step: int | None = None, need_decoder: bool = False) -> Source:
  """Weights of a run directory (pretraining or fine-tuning) or a Hugging Face NeoBERT directory."""
  p = paths.resolve(path, 'the model')
  if paths.is_url(p) and p.is_dir() and not (p / 'checkpoints').is_dir():
    p = paths.local_copy(p)  # a Hugging Face directory on a bucket: its tokenizer files are read by path
  if not p.is_dir():
    raise DataError(f'{path}: no such directory; give a training/fine-tuning workdir or a Hugging Face NeoBERT dir')
  if _is_hf_dir(p) and not (p / 'checkpoints').is_dir():
    from neobert_jax.model import hf_layout  # pylint: disable=g-import-not-at-top
    try:
      cfg, flat = hf_layout.read_hf_dir(p, init_missing_decoder=not need_decoder)
    except hf_layout.ConversionError as e:
      raise DataError(f'{path}: {str(e).splitlines()[0]}') from None
    return Source(cfg, flat, _hf_tokenizer(p), {}, str(p))
  from neobert_jax.train import checkpoint as ckpt  # pylint: disable=g-import-not-at-top
  try:
    cfg, flat = ckpt.restore_params(p, step)
    run_config = ckpt.read_config(p).to_dict()
  except FileNotFoundError as e:
    raise DataError(f'{path}: {e}; give a workdir with checkpoints or a Hugging Face NeoBERT directory') from None
  if need_decoder and 'decoder.kernel' not in flat:
    raise DataError(f'{path}: these weights have no MLM decoder (a fine-tuned model?); use a pretraining run '
                    'or a NeoBERT MLM export')
  return Source(cfg, flat, _run_tokenizer(run_config), run_config, str(p))


def _run_tokenizer(run_config: dict[str, Any]) -> str:
  """A run's tokenizer: named in its config, else recorded in its prepared data's manifest ('' if unknown)."""
  data = run_config.get('data', {})
  if data.get('tokenizer'):
    return str(data['tokenizer'])
  if data.get('dir'):
    from neobert_jax.data import shards  # pylint: disable=g-import-not-at-top
    manifest = paths.resolve(data['dir']) / shards.MANIFEST
    if manifest.exists():
      return str(json.loads(manifest.read_text()).get('tokenizer', {}).get('spec', ''))
  return ''  # the built-in corpus, or data no longer on this machine: the default (bert-base-uncased) applies


def encoder_params(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The encoder's weights with the 'encoder.' prefix removed (the layout of a NeoBERT module's own state)."""
  return {k[len('encoder.'):]: v for k, v in flat.items() if k.startswith('encoder.')}


def resolve_tokenizer(requested: str, source: Source | None) -> tokenizer_lib.Tokenizer:
  """The tokenizer to use: the requested one, else the source's, else bert-base-uncased; checked against the
  weights' vocabulary so a model is never fed ids from another vocabulary."""
  spec = requested or (source.tokenizer if source is not None else '') or DEFAULT_TOKENIZER
  try:
    tok = tokenizer_lib.load_tokenizer(spec)
  except (FileNotFoundError, ValueError) as e:
    raise DataError(f'tokenizer {spec!r}: {e}') from None
  if source is None:
    return tok
  vocab = int(source.model_cfg.vocab_size)
  if tok.vocab_size != vocab:
    raise DataError(f'{source.where}: the weights have a {vocab}-token vocabulary but tokenizer {spec!r} has '
                    f'{tok.vocab_size} tokens; these weights come from another vocabulary: use the tokenizer they '
                    'were pretrained with (--config.data.tokenizer=...) or a checkpoint of this vocabulary')
  if requested and source.tokenizer and source.tokenizer != requested:
    own = tokenizer_lib.load_tokenizer(source.tokenizer)
    if not tokenizer_lib.same_vocabulary(own.identity(), tok.identity()):
      raise DataError(f'{source.where}: pretrained with tokenizer {source.tokenizer!r}, whose vocabulary differs '
                      f'from {requested!r}; drop --config.data.tokenizer to use the pretraining tokenizer')
  return tok
