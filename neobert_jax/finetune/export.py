"""Fine-tuned NeoBERT -> directories that PyTorch users load offline with remote code: classification / regression
as a Hugging Face `AutoModelForSequenceClassification` directory (id2label, label2id, problem_type), contrastive as
a sentence-transformers directory (Transformer -> Pooling -> Normalize). The encoder goes through the MLM export's
mapping (weights/hf.py) and the one directory writer (convert/export_hf.write_hf_dir). The job calls export_run
when export.dir is set; by hand:

  python -m neobert_jax.finetune.export --run WORKDIR --output DIR [--overwrite] [--debug]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from neobert_jax import commandline, errors, paths
from neobert_jax.convert import model_card
from neobert_jax.convert.export_hf import check_output_dir, write_hf_dir
from neobert_jax.finetune import classification
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import hf, runs
from neobert_jax.weights import source as source_lib


def encoder_state_dict(flat: Mapping[str, Any], model_cfg: Any) -> dict[str, np.ndarray]:
  """'model.*' tensors of the HF layout for the 'encoder.*' entries of flat (no MLM decoder needed)."""
  enc = {k: np.asarray(v) for k, v in flat.items() if k.startswith('encoder.')}
  # The mapping converts whole NeoBERTLMHead dicts; a fine-tuned model has no decoder, so a placeholder one
  # passes through and is dropped again.
  shapes = flat_lib.flat_shapes(model_cfg)
  placeholder = {k: np.zeros(s, np.float32) for k, s in shapes.items() if k.startswith('decoder.')}
  sd = hf.flat_to_hf_state_dict({**enc, **placeholder}, model_cfg)
  return {k: x for k, x in sd.items() if not k.startswith('decoder.')}


def export_classifier(
  flat: Mapping[str, Any],
  model_cfg: Any,
  label_spec: Any,
  output: str | Path,
  *,
  tokenizer: str | None,
  dropout: float = 0.1,
  pooling: str = 'cls',
  card: Any = None,
  overwrite: bool = False,
) -> Path:
  """The HF sequence-classification directory (labels from a neobert_jax.finetune.classification.LabelSpec)."""
  check_output_dir(output, overwrite)
  state = encoder_state_dict(flat, model_cfg)
  for name in ('dense', 'classifier'):  # our [in, out] kernels -> torch Linear [out, in] weights
    state[f'{name}.weight'] = np.asarray(flat[f'{name}.kernel']).T
    state[f'{name}.bias'] = np.asarray(flat[f'{name}.bias'])
  state = {k: np.ascontiguousarray(v.astype(np.float32)) for k, v in state.items()}
  config = {**hf.hf_config_dict(model_cfg), 'architectures': ['NeoBERTForSequenceClassification']}
  config.update(classifier_dropout=float(dropout), classifier_pooling=pooling)
  if label_spec.kind == 'regression':
    config.update(num_labels=1, problem_type='regression', id2label={0: 'LABEL_0'}, label2id={'LABEL_0': 0})
  else:
    config.update(
      problem_type='single_label_classification',
      id2label={i: n for i, n in enumerate(label_spec.names)},
      label2id={n: i for i, n in enumerate(label_spec.names)},
    )
  return write_hf_dir(output, state, config, tokenizer=tokenizer, card=card, overwrite=overwrite)


def export_sentence_transformer(
  flat: Mapping[str, Any],
  model_cfg: Any,
  output: str | Path,
  *,
  tokenizer: str,
  pooling: str = 'mean',
  normalize: bool = True,
  max_seq_length: int = 512,
  query_prompt: str = '',
  card: Any = None,
  overwrite: bool = False,
) -> Path:
  """The sentence-transformers directory: base NeoBERT weights, tokenizer, pooling and normalisation modules."""
  check_output_dir(output, overwrite)
  # A base NeoBERT (AutoModel) state_dict has no 'model.' prefix.
  state = {
    k[len(hf.HF_PREFIX) :]: np.ascontiguousarray(v.astype(np.float32))
    for k, v in encoder_state_dict(flat, model_cfg).items()
  }
  config = {**hf.hf_config_dict(model_cfg), 'architectures': ['NeoBERTModel']}
  modules = [
    {'idx': 0, 'name': '0', 'path': '', 'type': 'sentence_transformers.models.Transformer'},
    {'idx': 1, 'name': '1', 'path': '1_Pooling', 'type': 'sentence_transformers.models.Pooling'},
  ]
  if normalize:
    modules.append({'idx': 2, 'name': '2', 'path': '2_Normalize', 'type': 'sentence_transformers.models.Normalize'})
  pooling_cfg = {
    'word_embedding_dimension': model_cfg.hidden_size,
    'pooling_mode_cls_token': pooling == 'cls',
    'pooling_mode_mean_tokens': pooling == 'mean',
    'pooling_mode_max_tokens': False,
    'pooling_mode_mean_sqrt_len_tokens': False,
    'pooling_mode_weightedmean_tokens': False,
    'pooling_mode_lasttoken': False,
    'include_prompt': True,
  }
  st_cfg = {
    'prompts': {'query': query_prompt} if query_prompt else {},
    'default_prompt_name': None,
    'similarity_fn_name': 'cosine',
  }

  def st_files(tmp: Path) -> None:
    (tmp / 'modules.json').write_text(json.dumps(modules, indent=2) + '\n')
    (tmp / 'sentence_bert_config.json').write_text(
      json.dumps({'max_seq_length': int(max_seq_length), 'do_lower_case': False}) + '\n'
    )
    (tmp / 'config_sentence_transformers.json').write_text(json.dumps(st_cfg, indent=2) + '\n')
    (tmp / '1_Pooling').mkdir()
    (tmp / '1_Pooling' / 'config.json').write_text(json.dumps(pooling_cfg, indent=2) + '\n')
    if normalize:
      (tmp / '2_Normalize').mkdir()

  return write_hf_dir(
    output,
    state,
    config,
    tokenizer=tokenizer,
    tokenizer_max_length=max_seq_length,
    extra=st_files,
    card=card,
    overwrite=overwrite,
  )


def export_run(workdir: str | Path, output: str | Path, *, overwrite: bool = False) -> Path:
  """Exports a fine-tuning workdir's best checkpoint in the format its task calls for."""
  check_output_dir(output, overwrite)
  workdir = paths.resolved(workdir, '--run')
  if not (workdir / runs.CONFIG_FILE).is_file():
    raise errors.ExportError(
      f'--run {workdir}: no config.json; give a workdir written by python -m neobert_jax.finetune'
    )
  cfg = runs.read_config(workdir)  # typed by the schema of the run that wrote it
  if 'task' not in cfg:
    raise errors.ExportError(
      f'--run {workdir}: not a fine-tuning run (use python -m neobert_jax.convert for pretraining runs)'
    )
  try:
    model_cfg, flat = runs.restore_params(workdir)
  except FileNotFoundError as e:
    raise errors.ExportError(f'--run {workdir}: {e}') from None
  data, head = cfg.data, cfg.head
  tokenizer = source_lib.run_tokenizer(cfg, workdir)  # the copy the run carries, else the recorded spec
  card = model_card.run_facts(workdir)  # the run's training facts for the model card (convert/model_card.py)
  kw = dict(tokenizer=tokenizer, card=card, overwrite=overwrite)
  if cfg.task == 'contrastive':
    return export_sentence_transformer(
      flat,
      model_cfg,
      output,
      pooling=head.pooling,
      normalize=head.normalize,
      max_seq_length=data.max_length,
      query_prompt=data.query_prefix,
      **kw,
    )
  labels = classification.load_labels(workdir)
  return export_classifier(flat, model_cfg, labels, output, dropout=head.dropout, pooling=head.classifier_pooling, **kw)


def main(argv: list[str] | None = None) -> int:
  p = commandline.Parser('export', 'neobert_jax.finetune.export', __doc__)
  p.add_argument('--run', required=True, help='fine-tuning workdir')
  p.add_argument('--output', required=True, help='directory to create')
  p.add_argument('--overwrite', action='store_true', help='replace a non-empty output directory')
  a = p.parse_args(argv)
  try:
    # One line and the export error's status, like `python -m neobert_jax.convert`.
    with errors.reported('export', a.debug, also={FileNotFoundError: errors.ExportError}):
      print(export_run(a.run, a.output, overwrite=a.overwrite))
  except SystemExit as e:
    return e.code
  return 0


if __name__ == '__main__':
  sys.exit(main())
