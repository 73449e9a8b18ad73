"""Inference speed of the exported PyTorch NeoBERT against transformers' ModernBERT-base, on this machine, in one run.

python -m benchmarks.export_inference [--threads 2] [--batch 8] [--max-length 1024] [--batches 2]
    [--models export,modernbert,reference] [--dtypes float32,bfloat16] [--workloads mixed,full] [--layers 28]
    [--no-onnx] [--ort-config KEY=VALUE,...] [--device cpu|cuda]

Three encoders, random weights at their real sizes (speed does not depend on the values), no MLM head:

* export: the directory `convert to-pytorch` writes (NeoBERT 28 x 768), loaded with
  `AutoModel.from_pretrained(dir, trust_remote_code=True)`: model.py's unpadded computation;
* modernbert: `transformers.ModernBertModel(ModernBertConfig())` (ModernBERT-base's shape, 22 x 768), SDPA
  attention, the native class (it unpads only under flash-attention-2, which CPUs do not have);
* reference: the export's weights computed the way the published chandar-lab/NeoBERT model.py does it
  (tests/support/torch_reference.py: every padded position, a dense additive [B, H, T, T] mask).

Workloads: `mixed` batches draw documents at random from the built-in real-text corpus (Shakespeare scenes and BBC
articles, tokenized with the bert-base-uncased vocabulary, truncated at --max-length) and pad each batch to its
longest; `full` batches are --max-length tokens in every row. Each (dtype, workload) runs one warm-up batch, then
--batches timed batches under torch.inference_mode, with torch.set_num_threads(--threads); the models take turns
batch by batch (a neighbour's load on a shared machine falls on all of them alike). It prints seq/s,
real tokens/s, the ratio to ModernBERT and parity with the export (on the warm-up batch: the largest difference of
last_hidden_state on real tokens relative to its scale, the least cosine of mean-pooled vectors) for each line,
then the same as JSON. The float32 lines add the export's ONNX graphs (`convert to-onnx --task hidden`) in onnxruntime on the
CPU with the same thread count: float32 (onnx/model.onnx) and int8 weights (onnx/model_quantized.onnx); --no-onnx
leaves them out. `--device cuda` runs the
PyTorch models on a GPU (SDPA's flash or memory-efficient kernels; ModernBERT without flash-attn, so padded), for
example with `--dtypes float16,bfloat16 --batch 32 --max-length 1024 --batches 10`.

A script, not part of the library (nothing imports it): run it from the repository root as above.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

MODELS = ('export', 'modernbert', 'reference')
PARITY = 1e-4  # the largest difference on real tokens, relative to the export's largest magnitude
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def cpu_name() -> str:
  try:
    for line in Path('/proc/cpuinfo').read_text().splitlines():
      if line.startswith('model name'):
        return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown CPU'


def corpus_token_ids(max_length: int) -> list[np.ndarray]:
  """The built-in corpus's documents as bert-base-uncased ids, [CLS] ... [SEP], truncated at max_length."""
  import tokenizers

  from neobert_jax.data import assets
  from neobert_jax.data.prepare import corpus

  with open(corpus.default_corpus_jsonl(), encoding='utf-8') as f:
    texts = [json.loads(line)['text'] for line in f]
  tok = tokenizers.Tokenizer.from_file(assets.bert_tokenizer_file())
  tok.no_padding()
  tok.enable_truncation(max_length)
  return [np.asarray(e.ids, np.int64) for e in tok.encode_batch(texts)]


def make_batches(docs, workload: str, batch: int, count: int, max_length: int, seed: int):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    if workload == 'full':
      ids = torch.from_numpy(rng.integers(1000, 30000, (batch, max_length)))
      out.append((ids, torch.ones_like(ids)))
      continue
    rows = [docs[i] for i in rng.integers(0, len(docs), batch)]
    length = max(len(r) for r in rows)
    ids = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for i, r in enumerate(rows):
      ids[i, : len(r)] = torch.from_numpy(r)
      mask[i, : len(r)] = 1
    out.append((ids, mask))
  return out


def export_dir(root: Path, layers: int) -> Path:
  """A real `convert to-pytorch` directory holding random NeoBERT weights (28 x 768 unless --layers)."""
  from neobert_jax.config.model import default_model_config
  from neobert_jax.convert import export_hf
  from neobert_jax.weights import hf

  cfg = default_model_config()
  cfg.num_layers = layers
  rng = np.random.default_rng(0)
  state = {k: rng.uniform(-0.02, 0.02, shape).astype(np.float32) for k, shape in hf.hf_shapes(cfg).items()}
  for k in state:
    if k.endswith('norm.weight'):
      state[k] = np.ones_like(state[k])
  return export_hf.export_flat(hf.hf_state_dict_to_flat(state, cfg), cfg, root / 'export')


def build(name: str, path: Path, dtype: torch.dtype, device: str = 'cpu'):
  """A call(ids, mask) running the model on ``device`` (the batch is moved there, and the call waits for it)."""
  call = _build(name, path, dtype, device)
  if device == 'cpu':
    return call

  def on_device(ids, mask):
    out = call(ids.to(device), mask.to(device))
    torch.cuda.synchronize()
    return out

  return on_device


def _build(name: str, path: Path, dtype: torch.dtype, device: str):
  from transformers import AutoModel

  if name == 'modernbert':
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    model = ModernBertModel(ModernBertConfig(attn_implementation='sdpa')).to(device, dtype).eval()
    return lambda ids, mask: model(input_ids=ids, attention_mask=mask).last_hidden_state
  model = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=dtype).to(device).eval()
  if name == 'export':
    return lambda ids, mask: model(input_ids=ids, attention_mask=mask).last_hidden_state
  from tests.support import torch_reference

  return lambda ids, mask: torch_reference.padded_reference_forward(model, ids, mask)


def session_entries(spec: str) -> dict[str, str]:
  """'key=value,key=value' (onnxruntime session config entries, e.g. session.dynamic_block_base=4) as a dict."""
  entries = {}
  for entry in filter(None, spec.split(',')):
    key, sep, value = entry.partition('=')
    if not sep or not key:
      raise argparse.ArgumentTypeError(f'{entry!r} is not key=value (e.g. session.dynamic_block_base=4)')
    entries[key] = value
  return entries


def ort_session(file: Path, threads: int, entries: dict[str, str]):
  """An onnxruntime CPU session of `file` on `threads` intra-op threads, with the session config `entries`."""
  import onnxruntime as ort

  options = ort.SessionOptions()
  options.intra_op_num_threads = threads
  options.inter_op_num_threads = 1
  for key, value in entries.items():
    options.add_session_config_entry(key, value)
  return ort.InferenceSession(str(file), options, providers=['CPUExecutionProvider'])


def build_onnx(path: Path, root: Path, threads: int, session_configs: tuple[dict[str, str], ...] = ()) -> dict:
  """The export's ONNX graphs (`convert to-onnx --task hidden`) in onnxruntime on the CPU: 'onnx' (float32,
  onnx/model.onnx) and 'onnx_int8' (int8 MatMul weights, onnx/model_quantized.onnx), each a call(ids, mask); and
  for each of `session_configs` (onnxruntime session config entries, `session_entries`) the float32 graph in a
  session with those entries, named 'onnx[key=value,...]'."""
  from neobert_jax.convert import onnx_export

  onnx_path = onnx_export.export_onnx(path, root / 'onnx', task='hidden')
  graphs = [('onnx', onnx_export.ONNX_NAME, {}), ('onnx_int8', onnx_export.QUANTIZED_NAME, {})]
  for entries in session_configs:
    graphs.append((f'onnx[{",".join(f"{k}={v}" for k, v in entries.items())}]', onnx_export.ONNX_NAME, entries))
  calls = {}
  for name, file, entries in graphs:
    session = ort_session(onnx_path / file, threads, entries)
    calls[name] = lambda ids, mask, s=session: torch.from_numpy(
      s.run(None, {'input_ids': ids.numpy(), 'attention_mask': mask.numpy()})[0]
    )
  return calls


def parity(outputs: dict, mask: torch.Tensor) -> dict[str, dict[str, float]]:
  """Each model's last_hidden_state on the warm-up batch (real text) against the PyTorch export's, on the real
  tokens: the largest difference relative to the export's largest magnitude, and the least cosine of the
  mean-pooled vectors. ModernBERT has weights of its own and is left out."""
  if 'export' not in outputs:
    return {}
  real = mask.bool()
  want = outputs['export'].float()
  weights = mask.unsqueeze(-1).float()
  pool = lambda h: torch.nn.functional.normalize((h.float() * weights).sum(1) / weights.sum(1), dim=-1)  # noqa: E731
  out = {}
  for name, got in outputs.items():
    if name in ('export', 'modernbert'):
      continue
    got = got.float()
    out[name] = {
      'max_rel_diff': float((got[real] - want[real]).abs().max() / want[real].abs().max()),
      'min_pooled_cosine': float((pool(got) * pool(want)).sum(-1).min()),
    }
  return out


def time_interleaved(calls: dict, batches) -> tuple[dict[str, float], dict]:
  """(seconds each call takes over batches[1:], their parity on batches[0]): a warm-up on batches[0] (also the
  ONNX sessions' first run), whose outputs are compared (`parity`). The calls take turns batch by batch, so a
  neighbour's load on a shared machine falls on all of them alike."""
  seconds = dict.fromkeys(calls, 0.0)
  with torch.inference_mode():
    warm = {name: call(*batches[0]) for name, call in calls.items()}
    checked = parity(warm, batches[0][1])
    del warm
    for ids, mask in batches[1:]:
      for name, call in calls.items():
        start = time.perf_counter()
        call(ids, mask)
        seconds[name] += time.perf_counter() - start
  return seconds, checked


def main(argv=None) -> None:
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.export_inference',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument('--threads', type=int, default=2)
  p.add_argument('--device', default='cpu', help="'cuda' on a GPU machine (then try --dtypes float16,bfloat16)")
  p.add_argument('--batch', type=int, default=8)
  p.add_argument(
    '--max-length', type=int, default=1024, help='NeoBERT stage 1 and the HF speed report (chandar-lab/NeoBERT #5)'
  )
  p.add_argument('--batches', type=int, default=2, help='timed batches per line (after one warm-up batch)')
  p.add_argument('--models', default=','.join(MODELS))
  p.add_argument('--dtypes', default='float32,bfloat16')
  p.add_argument('--workloads', default='mixed,full')
  p.add_argument('--layers', type=int, default=28, help="NeoBERT's layers (28 is the released model)")
  p.add_argument(
    '--onnx',
    action=argparse.BooleanOptionalAction,
    default=True,
    help="the export's ONNX graphs in onnxruntime (CPU; float32 and int8), with the float32 line (--no-onnx: not)",
  )
  p.add_argument(
    '--ort-config',
    action='append',
    default=[],
    type=session_entries,
    help='also time the float32 graph in a session with these onnxruntime config entries, e.g. '
    "'session.dynamic_block_base=4' or 'session.intra_op.allow_spinning=0' (repeatable; key=value,key=value)",
  )
  p.add_argument('--seed', type=int, default=0)
  a = p.parse_args(argv)
  torch.set_num_threads(a.threads)
  models = [m for m in a.models.split(',') if m]
  docs = corpus_token_ids(a.max_length)
  lengths = np.array([len(d) for d in docs])
  print(
    f'{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads; corpus: {len(docs)} documents, '
    f'mean length {lengths.mean():.0f} of at most {a.max_length} (median {np.median(lengths):.0f}); '
    f'batch {a.batch}, {a.batches} timed batches per line',
    flush=True,
  )
  results, onnx_calls = [], None
  with tempfile.TemporaryDirectory() as tmp:
    path = export_dir(Path(tmp), a.layers)
    for dtype in a.dtypes.split(','):
      calls = {n: build(n, path, DTYPES[dtype], a.device) for n in models}
      if a.onnx and dtype == 'float32':
        onnx_calls = onnx_calls or build_onnx(path, Path(tmp), a.threads, tuple(a.ort_config))
        calls.update(onnx_calls)
      for workload in a.workloads.split(','):
        batches = make_batches(docs, workload, a.batch, a.batches + 1, a.max_length, a.seed)
        timed = batches[1:]
        seqs = sum(ids.shape[0] for ids, _ in timed)
        tokens = sum(int(mask.sum()) for _, mask in timed)
        padded = sum(ids.numel() for ids, _ in timed)
        timings, checked = time_interleaved(calls, batches)
        for name, seconds in timings.items():
          results.append(
            {
              'model': name,
              'dtype': dtype,
              'workload': workload,
              'seq_per_s': seqs / seconds,
              'tokens_per_s': tokens / seconds,
              'real_token_fraction': tokens / padded,
              'parity': checked.get(name),
            }
          )
          print(f'  {name} {dtype} {workload}: {seqs / seconds:.2f} seq/s, {tokens / seconds:.0f} tokens/s', flush=True)
      del calls
  base = {(r['dtype'], r['workload']): r['seq_per_s'] for r in results if r['model'] == 'modernbert'}
  print(
    '\n| model | dtype | workload | seq/s | tokens/s | vs ModernBERT | vs export: max rel. diff, min pooled cosine |'
    '\n|---|---|---|---|---|---|---|'
  )
  for r in results:
    ref = base.get((r['dtype'], r['workload']))
    r['vs_modernbert'] = r['seq_per_s'] / ref if ref else None
    ratio = f'{r["vs_modernbert"]:.2f}x' if ref else '-'
    same = '-' if not r['parity'] else f'{r["parity"]["max_rel_diff"]:.1e}, {r["parity"]["min_pooled_cosine"]:.5f}'
    print(
      f'| {r["model"]} | {r["dtype"]} | {r["workload"]} | {r["seq_per_s"]:.2f} | {r["tokens_per_s"]:.0f} | {ratio} '
      f'| {same} |'
    )
  print(json.dumps({'cpu': cpu_name(), 'threads': a.threads, 'args': vars(a), 'results': results}, indent=2))
  # The same computation must give the same numbers: in float32, the reference and the ONNX graph within PARITY of
  # the export's scale (int8 weights and half precision are reported, not held to it).
  held = [r for r in results if r['parity'] and r['dtype'] == 'float32' and r['model'] != 'onnx_int8']
  off = [r for r in held if r['parity']['max_rel_diff'] > PARITY]
  if off:
    raise SystemExit(f'parity: {[(r["model"], r["dtype"], r["parity"]) for r in off]} differ from the export')
  print(f'parity: the reference and the float32 ONNX graph equal the export within {PARITY:g} of its scale')


if __name__ == '__main__':
  main()
