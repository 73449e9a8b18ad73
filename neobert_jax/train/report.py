"""The end-of-run report of a training job: what the model learned, against the bars that need no network.

Owns three things the loop writes after training (process 0 only):
  * the baselines of the held-out MLM loss (train/baselines.py): the unigram cross-entropies (a model below the
    held-out split's own entropy uses context) and the neighbour-count predictor at the evaluation's mask rate (a
    model below it has learned more than bigram statistics). Masking picks loss positions uniformly among
    non-special tokens, so these are the held-out MLM losses such predictors score.
  * the loss curve: WORKDIR/loss_curve.md, a table of train and held-out loss from metrics.jsonl, and
    WORKDIR/loss_curve.png, the held-out curve against wall-clock time and steps with the baselines drawn in.
  * fill-mask: one blank in each of 200 held-out rows (any token), 200 rows (a whole word) and 200 sentences on
    their own (any token), predicted by the exported Hugging Face directory through `transformers` (the export is
    what users load, so that is what is scored), with a few shown.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax import paths
from neobert_jax.config import train as train_config
from neobert_jax.data import pipeline
from neobert_jax.data import shards
from neobert_jax.data.pipeline import prepared
from neobert_jax.train import baselines
from neobert_jax.weights.runs import REPORT_FILE, loss_curve  # the run's metrics.jsonl, read as the card reads it

log = logging.getLogger('neobert_jax.train')


def _split_ids(
  data_cfg: ml_collections.ConfigDict, seq_len: int, split: str, max_tokens: int | None = None
) -> tuple[list[np.ndarray], shards.Manifest]:
  """The split's records as int32 arrays, in order; at most ~max_tokens of them (a sample of a large train split)."""
  manifest, files = pipeline.iter_split_files(data_cfg, seq_len, split)  # local, or fetched from a bucket one by one
  records, tokens, dtype = [], 0, manifest.id_dtype
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


_BASELINES_VERSION = 1  # bump when train/baselines.py changes what it computes: the cached results go stale
_TRAIN_SAMPLE_TOKENS = 20_000_000


def context_baselines(
  data_cfg: ml_collections.ConfigDict, seq_len: int, mask_rate: float, count: bool = True
) -> dict[str, Any] | None:
  """The bars to clear (train/baselines.py), from the held-out split and at most 20M tokens of the training split:
  {'held_out', 'train'} unigram cross-entropies and 'neighbours' {'loss', 'accuracy', 'k'} at `mask_rate`. With
  `count` False, only a result already cached (None if there is none): nothing is read."""
  manifest = prepared.open_prepared(data_cfg, seq_len)[1]
  # The manifest names every shard by its sha256, so it and the arguments pin the result: a re-run, a resume and
  # every run on the same prepared data read it back instead of counting again.
  key = json.dumps([_BASELINES_VERSION, manifest.text(), seq_len, mask_rate, _TRAIN_SAMPLE_TOKENS], sort_keys=True)
  cached = paths.cache_dir('baselines') / f'{hashlib.sha256(key.encode()).hexdigest()[:32]}.json'
  if cached.is_file():
    return json.loads(cached.read_text())
  if not count:
    return None
  held_out = _split_ids(data_cfg, seq_len, 'eval')[0]
  train = _split_ids(data_cfg, seq_len, 'train', max_tokens=_TRAIN_SAMPLE_TOKENS)[0]
  special, vocab = list(manifest.special_ids.values()), manifest.vocab_size
  out: dict[str, Any] = baselines.unigram(train, held_out, special, vocab)
  out['neighbours'] = baselines.neighbours(train, held_out, special, vocab, mask_rate)
  paths.write_text(cached, json.dumps(out))  # whole or absent, whichever process finishes first
  return out


def source_baselines(
  data_cfg: ml_collections.ConfigDict,
  seq_len: int,
  mask_rate: float,
  when: str,
  sources: prepared.Sources | None = None,
) -> dict[str, dict]:
  """The bars of each source (`sources`: the run's, default opened here): its own held-out split and training
  sample, as context_baselines computes them for one directory. A source without a held-out split has none, nor a
  mixture's source the run read record by record from a bucket unless `when` (eval.baselines) is 'on' or they are
  cached: counting its training sample would read more of it than the run did, and its bytes would no longer
  follow the weights."""
  sources = sources or prepared.open_data(data_cfg, seq_len)
  out = {}
  for name in sources.with_eval() if when != 'off' else ():
    directory, manifest = sources.opened[name]
    one = sources.config(data_cfg, name)
    count = when == 'on' or sources.mix.plain
    count = count or not prepared.reads_records(one, directory, manifest.shards('train'), True)
    bars = context_baselines(one, seq_len, mask_rate, count)
    if bars is None:
      log.info(
        'source %r: no baselines (its training split is read record by record from the bucket, and counting a '
        'sample of it would read more than the run did; eval.baselines=on counts them)',
        name,
      )
    else:
      out[name] = bars
  return out


def baseline_lines(bars: dict[str, Any]) -> list[str]:
  """The bars, one line each (the log, loss_curve.md)."""
  lines = [
    f'unigram cross-entropy of the held-out split (context-free): {bars["held_out"]:.3f} (its own token '
    f"frequencies), {bars['train']:.3f} (the training split's)"
  ]
  if 'neighbours' in bars:
    n = bars['neighbours']
    lines.append(
      f'neighbour counts (bigram p(x | left) p(right | x) from the training split, neighbours masked at the '
      f"evaluation's rate, k={n['k']}): {n['loss']:.3f}, accuracy {n['accuracy']:.3f}"
    )
  return lines


def write_curve_table(workdir: Path, bars: dict[str, Any] | None, every: int) -> Path:
  """WORKDIR/loss_curve.md: held-out rows and every `every`-th train row, under the baselines (if computed)."""
  fmt = lambda v: f'{v:.3f}' if isinstance(v, float) else ''
  rows = loss_curve(workdir)
  probes = sorted({k for r in rows for k in r if k.startswith('probe/') and k.endswith('/accuracy')})
  if bars is not None:
    lines = ['Baselines of the held-out MLM loss (nats):', ''] + [f'- {line}' for line in baseline_lines(bars)]
  else:
    lines = ['Baselines of the held-out MLM loss: not computed (eval.baselines, docs/configuration.md).', '']
  for r in rows:
    for k in sorted(k for k in r if k.endswith('/random_init_accuracy')):
      lines.append(f'- {k.removesuffix("/random_init_accuracy")}: a random init of this shape scores {r[k]:.3f}')
  sources = sorted({k for r in rows for k in r if k.endswith('/loss')})  # a mixture's, each on its held-out split
  head = ['step', 'train loss', 'held-out loss', 'held-out accuracy'] + [p.removesuffix('/accuracy') for p in probes]
  head += [f'held-out loss {k.removesuffix("/loss")}' for k in sources]
  lines += ['', '| ' + ' | '.join(head) + ' |', '|' + '---:|' * len(head)]
  for r in rows:
    if 'eval' in r or r['step'] % every == 0:
      cells = [str(r['step'])] + [fmt(r.get(k)) for k in ('train', 'eval', 'eval_accuracy', *probes, *sources)]
      lines.append('| ' + ' | '.join(cells) + ' |')
  out = workdir / 'loss_curve.md'
  paths.write_text(out, '\n'.join(lines) + '\n')
  return out


def write_curve_plot(workdir: Path, bars: dict[str, Any] | None) -> Path | None:
  """WORKDIR/loss_curve.png: held-out (and train) loss against wall-clock minutes and against steps, with the
  baselines as horizontal lines. None when no held-out row was logged."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')  # files only, never a display
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = loss_curve(workdir)
  held = [r for r in rows if 'eval' in r]
  if not held:
    return None
  t0 = min((r['time'] for r in rows if 'time' in r), default=None)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, axis in zip(axes, ('time', 'step')):
    if axis == 'time' and t0 is None:
      continue
    x = (lambda r: (r['time'] - t0) / 60) if axis == 'time' else (lambda r: r['step'])
    train = [r for r in rows if 'train' in r and (axis == 'step' or 'time' in r)]
    ax.plot([x(r) for r in train], [r['train'] for r in train], color='0.7', lw=1, label='train (batch)')
    timed = [r for r in held if axis == 'step' or 'time' in r]
    ax.plot([x(r) for r in timed], [r['eval'] for r in timed], 'o-', color='C0', label='held-out')
    if bars is not None:
      ax.axhline(bars['held_out'], color='C3', ls=':', label=f'unigram {bars["held_out"]:.2f}')
    if bars is not None and 'neighbours' in bars:
      n = bars['neighbours']['loss']
      ax.axhline(n, color='C2', ls='--', label=f'neighbour counts {n:.2f}')
    ax.set_xlabel('wall-clock minutes (from the first logged step)' if axis == 'time' else 'step')
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('MLM loss (nats)')
  lows = [r['eval'] for r in held]
  top = min(lows)
  if bars is not None:
    lows += [bars['held_out'], bars.get('neighbours', {}).get('loss', bars['held_out'])]
    top = max(bars['held_out'], top)
  axes[0].set_ylim(min(lows) - 0.3, top + 1.5)
  axes[1].legend(loc='upper right', fontsize=8)
  fig.tight_layout()
  out = workdir / 'loss_curve.png'
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=110)
  plt.close(fig)
  paths.write_bytes(out, png.getvalue())  # a gs:// workdir too: savefig(path) would open a local file of that name
  return out


def _blanked(tok: Any, ids: list[int], i: int) -> tuple[list[int], int, str]:
  """`ids` framed by [CLS] and [SEP] with token i blanked: (row, the blank's place in it, the hidden token)."""
  row = [tok.cls_token_id] + ids[:i] + [tok.mask_token_id] + ids[i + 1 :] + [tok.sep_token_id]
  return row, i + 1, tok.convert_ids_to_tokens(ids[i])


def _blank_rows(
  records: list[np.ndarray], tok: Any, width: int, n: int, rng: np.random.Generator, words_only: bool
) -> list[tuple[list[int], int, str]]:
  """`n` held-out rows of `width` tokens, each with one position blanked: (row with [CLS]/[SEP], blank, answer).

  words_only: the blank is a whole word (alphabetic and not split into pieces, so one token); otherwise any token
  of the row, chosen uniformly (what a masked-token predictor is asked in general: pieces and punctuation too)."""
  special = set(tok.all_special_ids)
  out = []
  for idx in rng.permutation(len(records)):
    ids = [int(i) for i in records[idx][1:-1][:width]]
    if len(ids) < width:
      continue
    pieces = tok.convert_ids_to_tokens(ids)
    spots = [
      i
      for i in range(3, width - 3)
      if ids[i] not in special and (not words_only or (pieces[i].isalpha() and not pieces[i + 1].startswith('##')))
    ]
    if not spots:
      continue
    i = spots[int(rng.integers(len(spots)))]
    out.append(_blanked(tok, ids, i))
    if len(out) == n:
      break
  return out


def _blank_sentences(
  records: list[np.ndarray], tok: Any, longest: int, n: int, rng: np.random.Generator
) -> list[tuple[list[int], int, str]]:
  """`n` held-out sentences, each alone in its row with one token blanked: (row, blank, answer), as `_blank_rows`.

  A sentence is a run of a document's tokens ending at '.', '!' or '?', of 8 to `longest` tokens: the short
  context a fill-mask pipeline user types, where a training-length row gives the model a whole paragraph."""
  special = set(tok.all_special_ids)
  ends = {i for i in tok.convert_tokens_to_ids(['.', '!', '?']) if i != tok.unk_token_id}
  sentences = []
  for record in records:
    start = 0
    ids = [int(i) for i in record]
    for i, token in enumerate(ids):
      if token in special:
        start = i + 1
      elif token in ends:
        if 8 <= i + 1 - start <= longest:
          sentences.append(ids[start : i + 1])
        start = i + 1
  out = []
  for idx in rng.permutation(len(sentences))[:n]:
    out.append(_blanked(tok, sentences[idx], int(rng.integers(len(sentences[idx])))))
  return out


FILL_MASK_KINDS = {
  'tokens': 'any token of a held-out row',
  'words': 'a whole word of one',
  'sentences': 'any token of a held-out sentence alone',
}


def fill_mask(
  hf_dir: str, data_cfg: ml_collections.ConfigDict, seq_len: int, n: int = 200, top: int = 5, shown: int = 12
) -> dict[str, Any]:
  """Fill-mask through the export and transformers, one blank per row, three ways:
    * 'tokens': any token of a held-out training-length row (the context the model learned from: up to
      `seq_len` tokens around the blank);
    * 'words': a whole word of such a row (the harder ask: no punctuation or word pieces);
    * 'sentences': any token of a held-out sentence on its own (8 to `seq_len` - 2 tokens of context, as a
      pipeline user would type one).
  Returns per kind how many answers were first and how many in the top `top` (over 200 rows a rate moves by
  about 0.035 per standard error), and one line per whole-word row showing `shown` tokens each side."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForMaskedLM, AutoTokenizer  # pylint: disable=g-import-not-at-top

  hf_dir = str(paths.local_copy(hf_dir, marker='config.json'))  # transformers reads local directories
  tok = AutoTokenizer.from_pretrained(hf_dir)
  model = AutoModelForMaskedLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
  records, _ = _split_ids(data_cfg, seq_len, 'eval')
  width = seq_len - 2  # the row without its [CLS] and [SEP]
  out: dict[str, Any] = {}
  for kind, seed in (('tokens', 1), ('words', 0), ('sentences', 2)):
    rng = np.random.default_rng(seed)
    if kind == 'sentences':
      blanked = _blank_sentences(records, tok, width, n, rng)
    else:
      blanked = _blank_rows(records, tok, width, n, rng, words_only=kind == 'words')
    logits = []
    with torch.no_grad():
      for k in range(0, len(blanked), 50):
        rows = [row for row, _, _ in blanked[k : k + 50]]
        ids = torch.full((len(rows), max(map(len, rows))), tok.pad_token_id)
        for j, row in enumerate(rows):
          ids[j, : len(row)] = torch.tensor(row)
        logits += list(model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long()).logits)
    first = in_top = 0
    lines = []
    for (row, blank, answer), row_logits in zip(blanked, logits):
      guesses = tok.convert_ids_to_tokens(torch.topk(row_logits[blank], top).indices.tolist())
      first += guesses[0] == answer
      in_top += answer in guesses
      mark = 'right' if guesses[0] == answer else (f'in top {top}' if answer in guesses else 'wrong')
      text = tok.decode(row[max(1, blank - shown) : min(len(row) - 1, blank + shown + 1)])
      lines.append(f'{text.replace(tok.mask_token, "____")!r}: {", ".join(guesses)} (answer {answer}: {mark})')
    out[kind] = {'n': len(blanked), 'first': first, f'top{top}': in_top}
    if kind == 'words':
      out['examples'] = lines
  return out


def report(
  cfg: ml_collections.ConfigDict,
  workdir: Path,
  evals: list[dict[str, float]],
  sources: prepared.Sources | None = None,
) -> dict[str, Any]:
  """Logs the held-out loss against the baselines, writes the curve (table and plot), shows fill-mask examples if
  the run exported, and records the figures in WORKDIR/report.json (the exports' model card quotes them).
  `sources`: the run's data as it opened it (default: opened here)."""
  seq_len = cfg.model.max_length
  mask_rate, when = train_config.eval_mask_rate(cfg), cfg.eval.baselines
  sources = sources or prepared.open_data(cfg.data, seq_len)
  per_bars = source_baselines(cfg.data, seq_len, mask_rate, when, sources)
  # The curve's bars: one source's (a mixture's first by name), a mixture's each source's below.
  bars = next(iter(per_bars.values()), None)
  per_bars = {} if sources.mix.plain else per_bars
  table = write_curve_table(workdir, bars, max(cfg.logging.log_every, 1) * 5)
  plot = write_curve_plot(workdir, bars)
  out: dict[str, Any] = {'curve': str(table)}
  if bars is not None:
    out.update(unigram={k: bars[k] for k in ('held_out', 'train')}, neighbours=bars['neighbours'])
    log.info('baselines of the held-out loss:\n  %s', '\n  '.join(baseline_lines(bars)))
  if plot is not None:
    out['plot'] = str(plot)
  if evals:
    last = evals[-1]
    out['eval_loss'] = last['loss']
    said = ''
    if bars is not None:
      gap = bars['neighbours']['loss'] - last['loss']
      beats = f'{gap:.3f} below' if gap > 0 else f'{-gap:.3f} above'
      said = f': {bars["held_out"] - last["loss"]:.3f} below the unigram entropy, {beats} the neighbour-count baseline'
    shown = f' and {plot}' if plot is not None and bars is not None else ''
    step = (last['loss'], last['accuracy'], last['step'])
    log.info('held-out MLM loss %.3f (accuracy %.3f) at step %d%s; loss curve %s%s', *step, said, table, shown)
    per_source = {k.removesuffix('/loss'): v for k, v in last.items() if k.endswith('/loss') and '/' in k}
    if per_source:
      out['eval_loss_per_source'] = per_source
      log.info('held-out MLM loss per source: %s', ', '.join(f'{n} {v:.3f}' for n, v in sorted(per_source.items())))
  if per_bars:
    out['baselines_per_source'] = {
      n: {'unigram': {k: b[k] for k in ('held_out', 'train')}, 'neighbours': b['neighbours']}
      for n, b in per_bars.items()
    }
    losses = out.get('eval_loss_per_source', {})
    for name, b in per_bars.items():
      loss = f'held-out MLM loss {losses[name]:.3f} against ' if name in losses else ''
      log.info(
        'source %r: %sits own baselines: unigram %.3f, neighbour counts %.3f',
        name,
        loss,
        b['held_out'],
        b['neighbours']['loss'],
      )
  if cfg.export.hf_dir:
    try:
      filled = fill_mask(cfg.export.hf_dir, sources.config(cfg.data, sources.mix.names[0], False), seq_len)
    except ImportError as e:  # the torch extra is optional for training
      log.info('fill-mask examples need torch and transformers (pip install .[torch]): %s', e)
    else:
      log.info(
        'fill-mask through %s and transformers, one blank per row, the true token in the top 5 (first): %s. The '
        'first six whole words:\n  %s',
        cfg.export.hf_dir,
        '; '.join(
          f'{label} {filled[k]["top5"]} of {filled[k]["n"]} ({filled[k]["first"]})'
          for k, label in FILL_MASK_KINDS.items()
        ),
        '\n  '.join(filled['examples'][:6]),
      )
      out['fill_mask'] = filled
  # The figures, for the model card of the run's exports (convert/model_card.py): whole or absent.
  paths.write_text(paths.Path(workdir) / REPORT_FILE, json.dumps(out, indent=2, default=float) + '\n')
  return out
