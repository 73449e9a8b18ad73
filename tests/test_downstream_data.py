"""Data readers (CSV / TSV / JSONL / Parquet), [CLS]/[SEP] framing and buckets, and starting a fine-tuning run
from a pretraining checkpoint or a Hugging Face directory."""

import json

import numpy as np
import orbax.checkpoint as ocp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flax import nnx

from neobert_jax.jobs import finetune as finetune_job
from neobert_jax.downstream import batching, tables
from neobert_jax.config.finetune import base_config
from neobert_jax.model import NeoBERTForMLM, default_model_config
from neobert_jax.engine import checkpoint as ckpt
from neobert_jax.weights import runs, source
from neobert_jax.weights.flat import to_flat


@pytest.mark.parametrize('fmt', ['csv', 'tsv', 'jsonl', 'parquet'])
def test_every_format_reads_the_same_columns(tmp_path, fmt):
  rows = [{'text': 'a "quoted, text', 'pair': 'x', 'label': -1}, {'text': 'b', 'pair': 'y', 'label': 1}]
  path = tmp_path / f'data.{fmt}'
  if fmt == 'jsonl':
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  elif fmt == 'parquet':
    pq.write_table(pa.Table.from_pylist(rows), path)
  elif fmt == 'tsv':
    path.write_text('text\tpair\tlabel\n' + ''.join(f'{r["text"]}\t{r["pair"]}\t{r["label"]}\n' for r in rows))
  else:
    path.write_text('text,pair,label\n"a ""quoted, text",x,-1\nb,y,1\n')
  table = tables.read_table(str(path))
  assert table['text'] == ['a "quoted, text', 'b'] and table['label'] == [-1, 1] and table['pair'] == ['x', 'y']


def test_framing_truncation_and_buckets():
  class Tok:
    cls_id, sep_id = 101, 102

    def encode_batch(self, texts):
      return [np.arange(1000, 1000 + int(t), dtype=np.int32) for t in texts]

  single, pair = batching.frame(Tok(), ['3', '50'], None, 8), batching.frame(Tok(), ['6', '2'], ['4', '9'], 9)
  assert single[0].tolist() == [101, 1000, 1001, 1002, 102] and len(single[1]) == 8 and single[1][-1] == 102
  assert pair[0].tolist() == [101, 1000, 1001, 1002, 102, 1000, 1001, 1002, 102]  # longest side trimmed first
  assert pair[1].tolist() == [101, 1000, 1001, 102, 1000, 1001, 1002, 1003, 102]
  assert batching.buckets(128, 16) == [16, 32, 64, 128] and batching.buckets(100, 16) == [16, 32, 64, 100]
  plan = batching.plan_batches([3, 40, 5, 17, 90], 2, batching.buckets(128), rng=None)
  assert [(b, list(i)) for b, i in plan] == [(16, [0, 2]), (32, [3]), (64, [1]), (128, [4])]


def _tiny_mlm():
  m = default_model_config()
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 32, 1, 2, 64
  return m, to_flat(NeoBERTForMLM(m, rngs=nnx.Rngs(3)))


def test_sources_give_the_encoder_weights(tmp_path):
  from neobert_jax.convert.export_hf import export_flat

  m, flat = _tiny_mlm()
  export_flat(flat, m, tmp_path / 'hf', tokenizer='bert-base-uncased')
  src = source.open_source(str(tmp_path / 'hf'))
  assert src.kind == 'hf' and src.model_cfg.hidden_size == 32
  assert src.tokenizer.endswith('tokenizer.json') and source.resolve_tokenizer('', src).vocab_size == 30522
  assert sorted(src.flat) == sorted(flat)
  for k, v in flat.items():
    np.testing.assert_array_equal(src.flat[k], v)


@pytest.mark.slow
def test_finetune_starts_from_a_pretraining_checkpoint(tmp_path):
  m, flat = _tiny_mlm()
  run = tmp_path / 'pretrain'
  pretrain_cfg = {'model': m.to_dict(), 'data': {'tokenizer': 'bert-base-uncased'}}
  (run).mkdir()
  (run / 'config.json').write_text(json.dumps(pretrain_cfg))
  nested = {}
  for key, value in flat.items():
    node = nested
    *parents, leaf = key.split('.')
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  with ckpt.make_manager(run, keep=1, async_save=False) as mngr:
    mngr.save(7, args=ocp.args.Composite(params=ocp.args.StandardSave(nested), config=ocp.args.JsonSave(pretrain_cfg)))
  rows = [{'text': f'{w} thing', 'label': w} for w in ('good', 'bad') * 8]
  (tmp_path / 'train.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  cfg = base_config('classification')
  cfg.init.from_checkpoint = str(run)
  cfg.data.train_file, cfg.data.max_length, cfg.data.min_bucket = str(tmp_path / 'train.jsonl'), 8, 8
  cfg.train.num_steps, cfg.train.batch_size, cfg.train.eval_batch_size = 1, 8, 8
  cfg.optimizer.lr = 1e-3  # one step at warmup's rate 0: the encoder must come out exactly as it went in
  cfg.logging.progress_bar = False
  finetune_job.finetune(cfg, tmp_path / 'ft')
  saved = json.loads((tmp_path / 'ft' / 'config.json').read_text())
  assert saved['model']['hidden_size'] == 32 and saved['data']['tokenizer'] == 'bert-base-uncased'
  _, tuned = runs.restore_params(tmp_path / 'ft')
  for k, v in flat.items():
    if k.startswith('encoder.'):
      np.testing.assert_array_equal(tuned[k], v)
  assert {'dense.kernel', 'classifier.bias'} <= set(tuned) and 'decoder.kernel' not in tuned
