"""The end-of-run report of a training job: what the model learned, against the baseline that needs no context.

Owns three things the loop writes after training (process 0 only):
  * the unigram cross-entropy of the held-out split: the loss of the best context-free predictor, which predicts
    every masked token with the split's own token frequencies (its entropy, in nats). Masking picks loss positions
    uniformly among non-special tokens, so this is exactly the held-out MLM loss such a predictor would score; a
    model below it uses context.
  * the loss curve: WORKDIR/loss_curve.md, a table of train and held-out loss from metrics.jsonl.
  * fill-mask examples: sentences of the held-out split with one word masked, predicted by the exported Hugging Face
    directory through `transformers` (the export is what users load, so that is what is shown).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax.data import pipeline
from neobert_jax.data import shards

log = logging.getLogger('neobert_jax.train')


def _eval_ids(data_cfg: ml_collections.ConfigDict, seq_len: int) -> tuple[list[np.ndarray], dict]:
  directory, manifest = pipeline.open_prepared(data_cfg, seq_len)
  records = []
  for path in shards.split_paths(directory, manifest, 'eval'):
    reader = ArrayRecordReader(path)
    records += [np.frombuffer(r, np.int32) for r in reader.read_all()]
    reader.close()
  return records, manifest


def unigram_cross_entropy(data_cfg: ml_collections.ConfigDict, seq_len: int) -> float:
  """Entropy (nats) of the held-out split's non-special token frequencies: the best context-free MLM loss."""
  records, manifest = _eval_ids(data_cfg, seq_len)
  ids = np.concatenate(records)
  ids = ids[~np.isin(ids, list(manifest['tokenizer']['special_ids'].values()))]
  p = np.bincount(ids).astype(np.float64)
  p = p[p > 0] / ids.size
  return float(-(p * np.log(p)).sum())


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


def write_curve_table(workdir: Path, unigram: float, every: int) -> Path:
  """WORKDIR/loss_curve.md: held-out rows and every `every`-th train row, with the unigram line."""
  fmt = lambda v: f'{v:.3f}' if isinstance(v, float) else ''
  lines = [f'Held-out unigram cross-entropy (context-free baseline): {unigram:.3f}', '',
           '| step | train loss | held-out loss | held-out accuracy |', '|---:|---:|---:|---:|']
  for r in loss_curve(workdir):
    if 'eval' in r or r['step'] % every == 0:
      lines.append(f'| {r["step"]} | {fmt(r.get("train"))} | {fmt(r.get("eval"))} | {fmt(r.get("eval_accuracy"))} |')
  out = workdir / 'loss_curve.md'
  out.write_text('\n'.join(lines) + '\n')
  return out


def fill_mask_examples(hf_dir: str, data_cfg: ml_collections.ConfigDict, seq_len: int, n: int = 6,
                       width: int = 14, top: int = 3) -> list[str]:
  """Held-out snippets with one whole word masked; the exported model's top predictions, via transformers."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForMaskedLM, AutoTokenizer  # pylint: disable=g-import-not-at-top
  tok = AutoTokenizer.from_pretrained(hf_dir)
  model = AutoModelForMaskedLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
  records, _ = _eval_ids(data_cfg, seq_len)
  rng = np.random.default_rng(0)
  special = set(tok.all_special_ids)
  out = []
  for idx in rng.permutation(len(records)):
    body = records[idx][1:-1]
    if len(body) < width + 2:
      continue
    start = int(rng.integers(0, len(body) - width))
    ids = [int(i) for i in body[start:start + width]]
    pieces = tok.convert_ids_to_tokens(ids)
    # a whole word in the middle: alphabetic, not split into pieces, so the blank is one token
    spots = [i for i in range(3, width - 3) if pieces[i].isalpha() and not pieces[i + 1].startswith('##')
             and ids[i] not in special]
    if not spots:
      continue
    i = spots[int(rng.integers(len(spots)))]
    answer = pieces[i]
    masked = [tok.cls_token_id] + ids[:i] + [tok.mask_token_id] + ids[i + 1:] + [tok.sep_token_id]
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
  seq_len = int(cfg.model.max_length)
  unigram = unigram_cross_entropy(cfg.data, seq_len)
  table = write_curve_table(workdir, unigram, max(int(cfg.logging.log_every), 1) * 5)
  out: dict[str, Any] = {'unigram': unigram, 'curve': str(table)}
  if evals:
    last = evals[-1]
    out['eval_loss'] = last['loss']
    below = unigram - last['loss']
    log.info('held-out MLM loss %.3f at step %d vs unigram cross-entropy %.3f of the held-out split: %s '
             '(perplexity %.0f vs %.0f); loss curve: %s', last['loss'], last['step'], unigram,
             f'{below:.3f} below, the model uses context' if below > 0 else f'{-below:.3f} above unigram',
             math.exp(last['loss']), math.exp(unigram), table)
  if cfg.export.hf_dir:
    try:
      examples = fill_mask_examples(cfg.export.hf_dir, cfg.data, seq_len)
    except ImportError as e:  # the torch extra is optional for training
      log.info('fill-mask examples need torch and transformers (pip install .[torch]): %s', e)
    else:
      log.info('fill-mask on held-out text, through %s and transformers:\n  %s', cfg.export.hf_dir,
               '\n  '.join(examples))
      out['fill_mask'] = examples
  return out
