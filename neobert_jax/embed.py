"""Embed texts with a NeoBERT: one float32 vector per text, written as an [N, D] .npy file in input order.

The model is a contrastive fine-tuning run (its pooling is used), a pretraining run or a Hugging Face directory
(mean pooling by default)."""

from __future__ import annotations

import argparse
import io
import sys
from typing import Sequence

import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from neobert_jax import commandline, errors, paths
from neobert_jax.downstream import batching, heads, tables
from neobert_jax import sharding as shd
from neobert_jax.weights import flat as flat_lib
from neobert_jax.weights import source as source_lib


class Encoder:
  """A loaded, sharded embedding model: encode(texts) -> [N, D] float32."""

  def __init__(
    self,
    src: source_lib.Source,
    tokenizer: str = '',
    pooling: str = '',
    normalize: bool | None = None,
    max_length: int = 512,
    batch_size: int = 64,
    prefix: str = '',
  ):
    # A contrastive fine-tuning run's head says how it embeds; any other model: mean pooling, not normalised.
    run = src.run_config
    head = run.head if run is not None and run.get('task') == 'contrastive' else None
    self.pooling = pooling or (head.pooling if head is not None else 'mean')
    self.normalize = (head is not None and head.normalize) if normalize is None else normalize
    self.tok = source_lib.resolve_tokenizer(tokenizer, src)
    self.max_length, self.prefix = int(max_length), prefix
    self.mesh = shd.inference_mesh()
    self.batch_size = -(-int(batch_size) // self.mesh.size) * self.mesh.size
    flat = {k: v for k, v in src.flat.items() if k.startswith('encoder.')}
    model_cfg = src.model_cfg
    graphdef, self.params, shardings = flat_lib.sharded_params(
      lambda: heads.Embedder(model_cfg, self.pooling, rngs=nnx.Rngs(0)), flat, self.mesh
    )
    self.forward = batching.jit_forward(graphdef, shardings, self.mesh)
    self.dim = model_cfg.hidden_size

  @classmethod
  def load(cls, path: str, step: int | None = None, **kwargs) -> 'Encoder':
    return cls(source_lib.open_source(path, step), **kwargs)

  def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
    seqs = batching.frame(self.tok, [self.prefix + t for t in texts], None, self.max_length)
    with tqdm(total=len(seqs), unit='text', desc='embed', dynamic_ncols=True, disable=not progress) as bar:
      buckets = batching.buckets(self.max_length)
      out = batching.run_batched(
        self.forward, self.params, seqs, self.batch_size, buckets, self.tok.pad_id, self.mesh, bar
      )
    if self.normalize:
      out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


def main(argv: list[str] | None = None) -> int:
  p = commandline.Parser('embed', 'neobert_jax.embed', __doc__)
  p.add_argument(
    '--model', required=True, help='contrastive fine-tuning or pretraining workdir, or a Hugging Face NeoBERT directory'
  )
  p.add_argument('--input', required=True, help='.txt (one text per line), CSV, TSV, JSONL or Parquet')
  p.add_argument('--output', required=True, help='.npy file')
  p.add_argument('--text-field', default='text')
  p.add_argument('--step', type=int, default=-1)
  p.add_argument('--tokenizer', default='')
  p.add_argument('--pooling', default='', choices=['', 'mean', 'cls'])
  p.add_argument('--normalize', default=None, action=argparse.BooleanOptionalAction)
  p.add_argument('--prefix', default='', help='prepended to every text (e.g. a query instruction)')
  p.add_argument('--max-length', type=int, default=512)
  p.add_argument('--batch-size', type=int, default=64)
  p.add_argument('--no-progress', action='store_true')
  a = p.parse_args(argv)
  try:
    with errors.reported('embed', a.debug):
      texts = tables.read_texts(a.input, a.text_field)
      options = {k: getattr(a, k) for k in ('tokenizer', 'pooling', 'normalize', 'max_length', 'batch_size', 'prefix')}
      enc = Encoder.load(a.model, None if a.step < 0 else a.step, **options)
      emb = enc.encode(texts, progress=not a.no_progress)
  except SystemExit as e:  # an expected error, already reported in one line
    return e.code
  buf = io.BytesIO()
  np.save(buf, emb)
  paths.write_bytes(paths.resolve(a.output, '--output'), buf.getvalue())  # whole or not at all, local or gs://
  print(
    f'{emb.shape[0]} embeddings of dimension {emb.shape[1]} ({enc.pooling} pooling'
    f'{", normalised" if enc.normalize else ""}) -> {a.output}'
  )
  return 0


if __name__ == '__main__':
  sys.exit(main())
