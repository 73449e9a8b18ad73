"""A Hugging Face NeoBERT directory (ours, or a sentence-transformers one) -> an ONNX directory laid out as
transformers.js, optimum and the Hub expect it: ``onnx/model.onnx`` (float32) and ``onnx/model_quantized.onnx``
(int8 MatMul weights). The tasks, opsets and layout: docs/export.md ("ONNX")."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

from neobert_jax import errors
from neobert_jax.convert import export_hf, model_card, onnx_rewrite, torch_ref
from neobert_jax.convert.hf_modeling import model as hf_model
from neobert_jax.weights import hf

ONNX_NAME = 'onnx/model.onnx'
QUANTIZED_NAME = 'onnx/model_quantized.onnx'
TASKS = ('mlm', 'embedding', 'hidden')
OUTPUT_NAMES = {
  'mlm': ('logits',),
  'embedding': ('last_hidden_state', 'sentence_embedding'),
  'hidden': ('last_hidden_state',),
}
# A sentence-transformers directory's module files, copied so that SentenceTransformer(out, backend='onnx') pools
# and normalises as the original does.
ST_FILES = ('modules.json', 'sentence_bert_config.json', 'config_sentence_transformers.json')
ST_DIRS = ('1_Pooling', '2_Normalize')
DEFAULT_OPSET = 23  # ONNX's Attention op; 18 for runtimes that lack it


def pooling_of(path: Path) -> tuple[str, bool]:
  """(pooling 'mean' | 'cls', normalise) of a sentence-transformers directory; ('mean', True) for any other."""
  if not (path / 'modules.json').is_file():
    return 'mean', True
  modules = json.loads((path / 'modules.json').read_text())
  normalize = any(m.get('type', '').endswith('.Normalize') for m in modules)
  pooling = 'mean'
  for m in modules:
    if m.get('type', '').endswith('.Pooling'):
      cfg = json.loads((path / m['path'] / 'config.json').read_text())
      if cfg.get('pooling_mode_cls_token'):
        pooling = 'cls'
      elif not cfg.get('pooling_mode_mean_tokens'):
        raise errors.ExportError(f'--input {path}: only mean and cls pooling can be exported to ONNX')
  return pooling, normalize


class Exported(torch.nn.Module):
  """What the ONNX graph computes: input_ids, attention_mask -> the task's outputs (OUTPUT_NAMES)."""

  def __init__(self, model: torch.nn.Module, task: str, pooling: str = 'mean', normalize: bool = True):
    super().__init__()
    self.model, self.task, self.pooling, self.normalize = model, task, pooling, normalize

  def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    out = self.model(input_ids=input_ids, attention_mask=attention_mask)
    if self.task == 'mlm':
      return out.logits
    if self.task == 'hidden':
      return out.last_hidden_state
    pooled = hf_model.pool(out.last_hidden_state, attention_mask, self.pooling)
    return out.last_hidden_state, torch.nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled


def load_exported(source: str | os.PathLike, task: str | None = None) -> tuple[Exported, dict]:
  """(the module to trace, float32 in eval mode; the directory's config.json) for an HF directory."""
  path = Path(source).expanduser()
  if not (path / 'config.json').is_file():
    raise errors.ExportError(f'--input {path}: not a Hugging Face directory (no config.json)')
  task = task or ('embedding' if (path / 'modules.json').is_file() else 'mlm')
  if task not in TASKS:
    raise errors.ExportError(f'--task {task!r}: choose one of {", ".join(TASKS)}')
  config, state = hf.read_hf_state_dict(path)
  cfg = hf.model_config_from_hf(config)
  if 'decoder.bias' not in state:
    if task == 'mlm':
      raise errors.ExportError(
        f'--input {path} has no MLM decoder (a base or sentence-transformers save): use --task embedding or hidden'
      )
    state.update({k: np.zeros(shape, np.float32) for k, shape in hf.decoder_shapes(cfg).items()})
  flat = hf.hf_state_dict_to_flat(state, cfg)
  cls = hf_model.NeoBERTLMHead if task == 'mlm' else hf_model.NeoBERTModel
  model = torch_ref.torch_model_from_flat(flat, cfg, 'float32', cls=cls)
  return Exported(model, task, *pooling_of(path)).eval(), config


def trace(module: Exported, opset: int = DEFAULT_OPSET):
  """The torch.onnx program (dynamo export) with dynamic batch and length axes."""
  ids = torch.tensor([[101, 2000, 2001, 102], [101, 2002, 102, 0]], dtype=torch.long)
  mask = (ids != 0).to(torch.long)
  axes = {0: torch.export.Dim('batch'), 1: torch.export.Dim('length')}
  with torch.no_grad():
    return torch.onnx.export(
      module,
      (ids, mask),
      dynamo=True,
      opset_version=opset,
      input_names=['input_ids', 'attention_mask'],
      output_names=list(OUTPUT_NAMES[module.task]),
      dynamic_shapes={'input_ids': axes, 'attention_mask': axes},
      verbose=False,
    )


def quantize(source: Path, target: Path) -> None:
  """int8 weights for every MatMul of ``source`` (dynamic quantization), checked to load in onnxruntime."""
  import onnxruntime
  from onnxruntime.quantization import QuantType, quantize_dynamic

  # Without the exporter's shape annotations: the quantizer turns each Gemm (a Linear on the [tokens, hidden] matrix)
  # into a MatMul on its transposed weight, and its own shape inference then contradicts the stale annotations.
  graph = onnx.load(str(source))
  del graph.graph.value_info[:]
  with tempfile.TemporaryDirectory() as tmp:
    bare = Path(tmp) / 'model.onnx'
    onnx.save(graph, str(bare))
    del graph
    quantize_dynamic(str(bare), str(target), op_types_to_quantize=['MatMul'], weight_type=QuantType.QInt8)
  onnx.checker.check_model(str(target))
  onnxruntime.InferenceSession(str(target), providers=['CPUExecutionProvider'])


def export_onnx(
  source: str | os.PathLike,
  output: str | os.PathLike,
  *,
  task: str | None = None,
  opset: int = DEFAULT_OPSET,
  overwrite: bool = False,
) -> Path:
  """Writes ``output``: both graphs, the input's config.json with onnx_task and onnx_outputs, and its other files."""
  export_hf.check_output_dir(output, overwrite)
  module, config = load_exported(source, task)
  program = trace(module, opset)
  src = Path(source).expanduser()
  has_tokenizer = any((src / name).is_file() for name in ('tokenizer.json', 'vocab.txt'))

  def fill(tmp: Path) -> None:
    (tmp / ONNX_NAME).parent.mkdir()
    program.save(str(tmp / ONNX_NAME))
    graph = onnx.load(str(tmp / ONNX_NAME))
    if any(onnx_rewrite.rewrite_graph(graph).values()):  # exact, for onnxruntime's speed
      onnx.checker.check_model(graph)
      onnx.save(graph, str(tmp / ONNX_NAME))
    quantize(tmp / ONNX_NAME, tmp / QUANTIZED_NAME)
    for name in ST_FILES:
      if (src / name).is_file():
        shutil.copyfile(src / name, tmp / name)
    for name in ST_DIRS:
      if (src / name).is_dir():
        shutil.copytree(src / name, tmp / name)

  return export_hf.write_hf_dir(
    output,
    None,
    {**config, 'onnx_task': module.task, 'onnx_outputs': list(OUTPUT_NAMES[module.task])},
    tokenizer=src if has_tokenizer else None,
    extra=fill,
    card=model_card.card_facts(src),  # the source's training facts, its loss curve included
    overwrite=overwrite,
  )


def usage(out: Path, task: str) -> str:
  """How to load what export_onnx wrote, from Python and from JavaScript."""
  pipeline = 'fill-mask' if task == 'mlm' else 'feature-extraction'
  lines = [
    f"  onnxruntime:      onnxruntime.InferenceSession('{out / ONNX_NAME}')  # outputs {', '.join(OUTPUT_NAMES[task])}",
    f"  transformers.js:  await pipeline('{pipeline}', '{out}')  # node: fp32; browsers (wasm): q8, {QUANTIZED_NAME}",
  ]
  if task == 'embedding' and (out / 'modules.json').is_file():
    lines.append(f"  sentence-transformers: SentenceTransformer('{out}', backend='onnx')  # needs optimum")
  return '\n'.join(lines)
