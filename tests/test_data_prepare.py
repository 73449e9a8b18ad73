"""Reading inputs and `prepare`: formats, long-document chunks, determinism across
worker counts, bad inputs, interrupted runs, and the SentencePiece tokenizer."""

import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from array_record.python.array_record_module import ArrayRecordReader

from neobert_jax import errors
from neobert_jax.data.prepare import local as prepare_lib
from neobert_jax.data import shards
from tests.support import synthetic_data
from neobert_jax.data.prepare import sources
from neobert_jax.data.prepare import splits
from neobert_jax.data import tokenizer as tokenizer_lib
from neobert_jax.data.prepare import train_sentencepiece

WORDS = ('the', 'cat', 'sat', 'on', 'mat', 'dog', 'ran', 'far', 'away', 'home')


def _text(rng, n_words):
  return ' '.join(rng.choice(WORDS, n_words)) + '.'


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
  return synthetic_data.write_wordpiece_vocab(str(tmp_path_factory.mktemp('vocab') / 'vocab.txt'), WORDS)


def _records(path, dtype):
  r = ArrayRecordReader(path)
  out = [shards.decode(x, dtype) for x in r.read_all()]
  r.close()
  return out


def _all_records(directory, split='train'):
  m = shards.Manifest.read(directory)
  dtype = m.id_dtype
  return [rec for s in m.shards(split) for rec in _records(os.path.join(directory, s['file']), dtype)]


def test_formats_and_compression(tmp_path):
  docs = ['first doc', 'second doc', 'third doc']
  (tmp_path / 'a.txt').write_text('\n'.join(docs) + '\n')
  (tmp_path / 'b.txt').write_text('para one\nstill one\n\n\npara two\n')
  with gzip.open(tmp_path / 'c.jsonl.gz', 'wt') as f:
    f.writelines(json.dumps({'body': d}) + '\n' for d in docs)
  (tmp_path / 'd.jsonl.zst').write_bytes(
    zstandard.ZstdCompressor().compress(''.join(json.dumps({'body': d}) + '\n' for d in docs).encode())
  )
  pq.write_table(pa.table({'body': docs, 'n': [1, 2, 3]}), tmp_path / 'e.parquet')
  read = lambda name, **kw: [d.text for d in sources.iter_documents(str(tmp_path / name), **kw)]
  assert read('a.txt') == docs
  assert read('b.txt', text_mode='blank') == ['para one\nstill one', 'para two']
  assert read('b.txt', text_mode='file') == ['para one\nstill one\n\n\npara two\n']
  for name in ('c.jsonl.gz', 'd.jsonl.zst', 'e.parquet'):
    assert read(name, text_field='body') == docs, name
  assert sources.expand_inputs([str(tmp_path)]) == sorted(str(p) for p in tmp_path.iterdir())
  assert sources.expand_inputs([str(tmp_path / '*.txt')]) == [str(tmp_path / 'a.txt'), str(tmp_path / 'b.txt')]


def test_input_errors_are_clear(tmp_path):
  with pytest.raises(errors.DataError, match='no such file'):
    sources.expand_inputs([str(tmp_path / 'missing.txt')])
  with pytest.raises(errors.DataError, match='matches no files'):
    sources.expand_inputs([str(tmp_path / '*.jsonl')])
  (tmp_path / 'x.jsonl').write_text('{"text": "a"}\n{"body": "b"}\n')
  with pytest.raises(errors.DataError, match=r"x.jsonl:2: no field 'text' \(found \['body'\]\)"):
    list(sources.iter_documents(str(tmp_path / 'x.jsonl')))
  pq.write_table(pa.table({'body': ['a']}), tmp_path / 'y.parquet')
  with pytest.raises(errors.DataError, match=r"no column 'text' \(columns: \['body'\]\)"):
    list(sources.iter_documents(str(tmp_path / 'y.parquet')))
  (tmp_path / 'z.txt.gz').write_bytes(gzip.compress(b'hello\n' * 1000)[:40])
  with pytest.raises(errors.DataError, match='cannot decompress'):
    list(sources.iter_documents(str(tmp_path / 'z.txt.gz')))


def test_undecodable_bytes_are_reported_with_offset(tmp_path):
  (tmp_path / 'bad.txt').write_bytes(b'good line\nbad \xff byte\n')
  issues = []
  docs = list(sources.iter_documents(str(tmp_path / 'bad.txt'), on_issue=issues.append))
  assert [d.text for d in docs] == ['good line', 'bad \ufffd byte']
  assert len(issues) == 1 and issues[0].offset == 14 and issues[0].path.endswith('bad.txt')
  with pytest.raises(errors.DataError, match='byte offset 14'):
    list(sources.iter_documents(str(tmp_path / 'bad.txt'), on_decode_error='fail'))


def test_prepare_chunks_long_documents_without_losing_tokens(tmp_path, vocab):
  rng = np.random.default_rng(0)
  texts = [_text(rng, n) for n in (3, 40, 200, 7)] + ['', '   ']
  (tmp_path / 'in.txt').write_text('\n'.join(texts) + '\n')
  out = str(tmp_path / 'out')
  m = prepare_lib.prepare_local([str(tmp_path / 'in.txt')], out, tokenizer=vocab, max_length=16, eval_fraction=0.0)
  assert m['skipped_empty_documents'] == 2 and m['splits']['train']['documents'] == 4
  tok = tokenizer_lib.load_tokenizer(vocab)
  recs = _all_records(out)
  assert all(len(r) <= 16 and r[0] == tok.cls_id and r[-1] == tok.sep_id for r in recs)
  body = np.concatenate([r[1:-1] for r in recs])
  want = np.concatenate(tok.encode_batch([t for t in texts if t.strip()]))
  np.testing.assert_array_equal(body, want)  # every token, in order
  assert m['splits']['train']['tokens'] == sum(len(r) for r in recs)
  assert m['tokenizer']['vocab_size'] == tok.vocab_size
  assert m['split_long_documents'] == 2


def test_prepare_is_identical_for_any_worker_count_and_holds_out(tmp_path, vocab):
  rng = np.random.default_rng(1)
  lines = [json.dumps({'text': _text(rng, int(rng.integers(1, 80)))}) for _ in range(3000)]
  (tmp_path / 'in.jsonl').write_text('\n'.join(lines) + '\n')
  outs = []
  for workers in (0, 2):
    out = str(tmp_path / f'w{workers}')
    m = prepare_lib.prepare_local(
      [str(tmp_path / 'in.jsonl')],
      out,
      tokenizer=vocab,
      max_length=32,
      workers=workers,
      eval_fraction=0.1,
      shard_mb=0.05,
    )
    outs.append((out, m))
  (a, ma), (b, mb) = outs
  assert len(ma['splits']['train']['shards']) > 1
  for split in ('train', 'eval'):
    assert ma['splits'][split] == mb['splits'][split]
    for s in ma['splits'][split]['shards']:
      assert open(os.path.join(a, s['file']), 'rb').read() == open(os.path.join(b, s['file']), 'rb').read()
  n_eval = ma['splits']['eval']['documents']
  assert 0.07 < n_eval / 3000 < 0.13


def test_prepare_refuses_bad_runs_and_leaves_nothing_half_done(tmp_path, vocab):
  (tmp_path / 'empty.txt').write_text('\n  \n\n')
  out = tmp_path / 'out'
  with pytest.raises(errors.DataError, match='corpus is empty'):
    prepare_lib.prepare_local([str(tmp_path / 'empty.txt')], str(out), tokenizer=vocab)
  assert not out.exists()  # a refused build leaves no output directory behind (nor a lease)
  # A failure half-way (bad JSON after many good lines) leaves no shards and no manifest.
  rng = np.random.default_rng(2)
  good = [json.dumps({'text': _text(rng, 50)}) for _ in range(3000)]
  (tmp_path / 'half.jsonl').write_text('\n'.join(good) + '\n{oops\n')
  with pytest.raises(errors.DataError, match=r'half.jsonl:3001 .*not valid JSON'):
    prepare_lib.prepare_local([str(tmp_path / 'half.jsonl')], str(out), tokenizer=vocab, shard_mb=0.01)
  assert not out.exists()  # a refused build leaves no output directory behind (nor a lease)
  with pytest.raises(FileNotFoundError, match='no such file'):
    prepare_lib.prepare_local([str(tmp_path / 'empty.txt')], str(out), tokenizer='nope.txt')
  ok = tmp_path / 'ok.txt'
  ok.write_text('the cat\n')
  prepare_lib.prepare_local([str(ok)], str(out), tokenizer=vocab, eval_fraction=0)
  with pytest.raises(FileExistsError, match='--overwrite'):
    prepare_lib.prepare_local([str(ok)], str(out), tokenizer=vocab)


def test_cli_records_command(tmp_path, vocab, capsys):
  (tmp_path / 'in.txt').write_text('the cat sat\nthe dog ran\n')
  out = str(tmp_path / 'out')
  argv = [
    '--input',
    str(tmp_path / 'in.txt'),
    '--output',
    out,
    '--tokenizer',
    vocab,
    '--max-length',
    '64',
    '--workers',
    '0',
    '--eval-fraction',
    '0',
    '--no-progress',
  ]
  m = prepare_lib.main(argv)
  assert m['command'].startswith('python -m neobert_jax.data.prepare --input')
  assert 'prepared 2 train' in capsys.readouterr().out
  with pytest.raises(SystemExit, match='no such file'):
    prepare_lib.main(['--input', str(tmp_path / 'gone.txt'), '--output', out])


def test_sentencepiece_train_load_prepare(tmp_path):
  rng = np.random.default_rng(3)
  (tmp_path / 'c.txt').write_text('\n'.join(_text(rng, 30) for _ in range(300)) + '\n')
  tok = train_sentencepiece.train_tokenizer([str(tmp_path / 'c.txt')], str(tmp_path / 'sp'), vocab_size=30)
  assert tok.kind == 'sentencepiece' and tok.vocab_size == 30
  assert tok.special == {'pad': 0, 'unk': 1, 'cls': 2, 'sep': 3, 'mask': 4}
  ids = tok.encode_batch(['the cat sat on the mat.'])[0]
  assert ids.size and ids.min() >= 5
  out = str(tmp_path / 'out')
  m = prepare_lib.prepare_local(
    [str(tmp_path / 'c.txt')], out, tokenizer=str(tmp_path / 'sp.model'), max_length=64, eval_fraction=0
  )
  assert m['tokenizer']['kind'] == 'sentencepiece' and m['tokenizer']['vocab_size'] == 30
  assert all(r[0] == 2 and r[-1] == 3 for r in _all_records(out))


def _seekable_zst(frames: list[bytes]) -> bytes:
  """A seekable-format .zst (zstd/contrib/seekable_format): one frame per part, then the seek table."""
  c = zstandard.ZstdCompressor()
  parts = [c.compress(f) for f in frames]
  table = b''.join(len(p).to_bytes(4, 'little') + len(f).to_bytes(4, 'little') for p, f in zip(parts, frames))
  table += len(frames).to_bytes(4, 'little') + b'\0' + (0x8F92EAB1).to_bytes(4, 'little')
  return b''.join(parts) + (0x184D2A5E).to_bytes(4, 'little') + len(table).to_bytes(4, 'little') + table


def test_parts_of_a_file_read_as_the_whole_file(tmp_path, capsys):
  """splits.plan cuts text, JSONL, multi-frame / seekable .zst and Parquet; its parts' documents, in order, are the
  whole file's (offsets included), paragraphs are never cut, and an error's line number counts from the file's
  start; what cannot be cut (gzip, one frame) is one unit with a warning."""
  rng = np.random.default_rng(4)
  lines = [_text(rng, int(rng.integers(0, 30))) if rng.random() > 0.2 else '' for _ in range(400)]
  text = '\n'.join(lines) + '\n'
  jsonl = ''.join(json.dumps({'text': t}) + '\n' for t in lines)
  (tmp_path / 'a.txt').write_text(text)
  (tmp_path / 'a.jsonl').write_text(jsonl)
  frames = [jsonl.encode()[i : i + 3000] for i in range(0, len(jsonl), 3000)]  # frames end mid-line
  c = zstandard.ZstdCompressor()
  (tmp_path / 'b.jsonl.zst').write_bytes(b''.join(c.compress(f) for f in frames))
  (tmp_path / 'c.jsonl.zst').write_bytes(_seekable_zst(frames))
  (tmp_path / 'd.jsonl.gz').write_bytes(gzip.compress(jsonl.encode()))
  pq.write_table(pa.table({'text': lines}), tmp_path / 'e.parquet', row_group_size=37)
  whole = lambda path, **kw: [(d.text, d.offset) for d in sources.iter_documents(path, **kw)]
  for name, kw in (
    ('a.txt', {}),
    ('a.txt', {'text_mode': 'blank'}),
    ('a.jsonl', {}),
    ('b.jsonl.zst', {}),
    ('c.jsonl.zst', {}),
    ('e.parquet', {}),
  ):
    path = str(tmp_path / name)
    for split_bytes in (300, 1777):
      units, sizes = splits.plan([path], split_bytes, kw.get('text_mode', 'line'))
      assert len(units) > 1 and sizes[path] == os.path.getsize(path), (name, split_bytes)
      parts = [(d.text, d.offset) for p, span in units for d in sources.iter_documents(p, span=span, **kw)]
      assert parts == whole(path, **kw), (name, kw, split_bytes)
  units, _ = splits.plan([str(tmp_path / 'd.jsonl.gz'), str(tmp_path / 'a.txt')], 500, 'file')
  assert [s for _, s in units] == [None, None]
  assert 'd.jsonl.gz' in capsys.readouterr().err
  lines[300] = '{oops'
  (tmp_path / 'bad.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in lines[:300]) + '{oops\n')
  with pytest.raises(errors.DataError) as whole_error:
    list(sources.iter_documents(str(tmp_path / 'bad.jsonl')))
  units, _ = splits.plan([str(tmp_path / 'bad.jsonl')], 700)
  with pytest.raises(errors.DataError) as part_error:
    [d for p, span in units for d in sources.iter_documents(p, span=span)]
  assert str(part_error.value) == str(whole_error.value) and 'bad.jsonl:301 ' in str(whole_error.value)
