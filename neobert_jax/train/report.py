"""The end-of-run report of a training job: what the model learned, against the baseline that needs no context.

Owns three things the loop writes after training (process 0 only):
  * the unigram cross-entropy of the held-out split: the loss of the best context-free predictor, which predicts
    every masked token with the split's own token frequencies (its entropy, in nats), and the (higher) loss of one
    that uses the training split's frequencies. Masking picks loss positions uniformly among non-special tokens, so
    these are the held-out MLM losses such predictors score; a model below the first uses context.
  * the loss curve: WORKDIR/loss_curve.md, a table of train and held-out loss from metrics.jsonl.
  * fill-mask examples: sentences of the held-out split with one word masked, predicted by the exported Hugging Face
    directory through `transformers` (the export is what users load, so that is what is shown).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax import paths
from neobert_jax.data.pipeline import iterators as pipeline
from neobert_jax.data import shards

log = logging.getLogger('neobert_jax.train')


def _split_ids(
  data_cfg: ml_collections.ConfigDict, seq_len: int, split: str, max_tokens: int | None = None
) -> tuple[list[np.ndarray], dict]:
  """The split's records as int32 arrays, in order; at most ~max_tokens of them (a sample of a large train split)."""
  manifest, files = pipeline.iter_split_files(data_cfg, seq_len, split)  # local, or fetched from a bucket one by one
  records, tokens, dtype = [], 0, shards.id_dtype(manifest)
  for path in files:
    if max_tokens is not None and tokens >= max_tokens:
      break  # before the next file is fetched
    reader = ArrayRecordReader(path)
    n = reader.num_records()
    if max_tokens is None:
      records += [shards.decode(r, dtype) for r in reader.read_all()]
    else:
      for start in range(0, n, 1024):
        if tokens >= max_tokens:
          break
        chunk = [shards.decode(r, dtype) for r in reader.read(range(start, min(start + 1024, n)))]
        records += chunk
        tokens += sum(c.size for c in chunk)
    reader.close()
  return records, manifest


def _non_special(records: list[np.ndarray], manifest: dict) -> np.ndarray:
  ids = np.concatenate(records)
  return ids[~np.isin(ids, list(manifest['tokenizer']['special_ids'].values()))]


def unigram_cross_entropy(data_cfg: ml_collections.ConfigDict, seq_len: int) -> dict[str, float]:
  """Context-free baselines of the held-out MLM loss, in nats.

  'held_out': the entropy of the held-out split's own token frequencies, the best any context-free predictor
  can score on it (it knows the answer's distribution). 'train': the cross-entropy of the held-out tokens under
  the training split's frequencies (add-one smoothed; at most 20M training tokens read), which is what a model
  that learned only unigram statistics scores.
  """
  records, manifest = _split_ids(data_cfg, seq_len, 'eval')
  held_out = _non_special(records, manifest)
  vocab = int(manifest['tokenizer']['vocab_size'])
  p = np.bincount(held_out, minlength=vocab).astype(np.float64) / held_out.size
  entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
  train = _non_special(_split_ids(data_cfg, seq_len, 'train', max_tokens=20_000_000)[0], manifest)
  q = (np.bincount(train, minlength=vocab).astype(np.float64) + 1.0) / (train.size + vocab)
  return {'held_out': entropy, 'train': float(-np.log(q[held_out]).mean())}


def loss_curve(workdir: Path) -> list[dict[str, Any]]:
  """Rows {step, train, eval} from metrics.jsonl (a resumed run's later lines win)."""
  rows: dict[int, dict[str, Any]] = {}
  path = workdir / 'metrics.jsonl'
  if not path.is_file():
    return []
  for line in path.read_text().splitlines():
    if not line.strip():
      continue
    rec = json.loads(line)
    row = rows.setdefault(int(rec['step']), {'step': int(rec['step'])})
    for key, name in (('train/loss', 'train'), ('eval/loss', 'eval'), ('eval/accuracy', 'eval_accuracy')):
      if key in rec:
        row[name] = rec[key]
  return [rows[s] for s in sorted(rows)]


def write_curve_table(workdir: Path, unigram: dict[str, float], every: int) -> Path:
  """WORKDIR/loss_curve.md: held-out rows and every `every`-th train row, with the unigram baselines."""
  fmt = lambda v: f'{v:.3f}' if isinstance(v, float) else ''
  lines = [
    f'Unigram cross-entropy of the held-out split (context-free baselines): {unigram["held_out"]:.3f} '
    f"(its own token frequencies), {unigram['train']:.3f} (the training split's)",
    '',
    '| step | train loss | held-out loss | held-out accuracy |',
    '|---:|---:|---:|---:|',
  ]
  for r in loss_curve(workdir):
    if 'eval' in r or r['step'] % every == 0:
      lines.append(f'| {r["step"]} | {fmt(r.get("train"))} | {fmt(r.get("eval"))} | {fmt(r.get("eval_accuracy"))} |')
  out = workdir / 'loss_curve.md'
  out.write_text('\n'.join(lines) + '\n')
  return out


def fill_mask_examples(
  hf_dir: str, data_cfg: ml_collections.ConfigDict, seq_len: int, n: int = 6, width: int = 14, top: int = 3
) -> list[str]:
  """Held-out snippets with one whole word masked; the exported model's top predictions, via transformers."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForMaskedLM, AutoTokenizer  # pylint: disable=g-import-not-at-top

  hf_dir = str(paths.local_copy(hf_dir, marker='config.json'))  # transformers reads local directories
  tok = AutoTokenizer.from_pretrained(hf_dir)
  model = AutoModelForMaskedLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
  records, _ = _split_ids(data_cfg, seq_len, 'eval')
  rng = np.random.default_rng(0)
  special = set(tok.all_special_ids)
  out = []
  for idx in rng.permutation(len(records)):
    body = records[idx][1:-1]
    if len(body) < width + 2:
      continue
    start = int(rng.integers(0, len(body) - width))
    ids = [int(i) for i in body[start : start + width]]
    pieces = tok.convert_ids_to_tokens(ids)
    # a whole word in the middle: alphabetic, not split into pieces, so the blank is one token
    spots = [
      i
      for i in range(3, width - 3)
      if pieces[i].isalpha() and not pieces[i + 1].startswith('##') and ids[i] not in special
    ]
    if not spots:
      continue
    i = spots[int(rng.integers(len(spots)))]
    answer = pieces[i]
    masked = [tok.cls_token_id] + ids[:i] + [tok.mask_token_id] + ids[i + 1 :] + [tok.sep_token_id]
    with torch.no_grad():
      logits = model(input_ids=torch.tensor([masked])).logits[0, i + 1]
    guesses = tok.convert_ids_to_tokens(torch.topk(logits, top).indices.tolist())
    text = tok.decode(masked[1:-1]).replace(tok.mask_token, '____')
    mark = 'right' if guesses[0] == answer else ('in top %d' % top if answer in guesses else 'wrong')
    out.append(f'{text!r}: {", ".join(guesses)} (answer {answer}: {mark})')
    if len(out) == n:
      break
  return out


def report(cfg: ml_collections.ConfigDict, workdir: Path, evals: list[dict[str, float]]) -> dict[str, Any]:
  """Logs held-out loss against unigram, writes the curve table, shows fill-mask examples if the run exported."""
  seq_len = cfg.model.max_length
  unigram = unigram_cross_entropy(cfg.data, seq_len)
  table = write_curve_table(workdir, unigram, max(cfg.logging.log_every, 1) * 5)
  out: dict[str, Any] = {'unigram': unigram, 'curve': str(table)}
  if evals:
    last = evals[-1]
    out['eval_loss'] = last['loss']
    below = unigram['held_out'] - last['loss']
    log.info(
      'held-out MLM loss %.3f (accuracy %.3f) at step %d; unigram cross-entropy of the held-out split %.3f '
      "(%.3f with the training split's frequencies): %s; loss curve %s",
      last['loss'],
      last['accuracy'],
      last['step'],
      unigram['held_out'],
      unigram['train'],
      f'{below:.3f} below, the model uses context' if below > 0 else f'{-below:.3f} above',
      table,
    )
  if cfg.export.hf_dir:
    try:
      examples = fill_mask_examples(cfg.export.hf_dir, cfg.data, seq_len)
    except ImportError as e:  # the torch extra is optional for training
      log.info('fill-mask examples need torch and transformers (pip install .[torch]): %s', e)
    else:
      log.info(
        'fill-mask on held-out text, through %s and transformers:\n  %s', cfg.export.hf_dir, '\n  '.join(examples)
      )
      out['fill_mask'] = examples
  return out
