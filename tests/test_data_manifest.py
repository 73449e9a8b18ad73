"""The typed manifest (neobert_jax/data/shards.py Manifest): one reader, one writer, and no code above data/ that
indexes a manifest by string key (a renamed field would then fail far from the reader that checks it)."""

import ast
import pathlib

import pytest

from neobert_jax import errors
from neobert_jax.data import shards
from tests.support import synthetic_data

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'neobert_jax'


def _names_a_manifest(node: ast.expr) -> bool:
  name = node.id if isinstance(node, ast.Name) else getattr(node, 'attr', '')
  return 'manifest' in name.lower() or name == 'raw'


def _string_key_reads(tree: ast.AST) -> list[int]:
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Subscript) and _names_a_manifest(node.value):
      found.append(node.lineno)
    elif isinstance(node, ast.Attribute) and node.attr == 'raw':
      found.append(node.lineno)
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == 'get'
      and _names_a_manifest(node.func.value)
    ):
      found.append(node.lineno)
  return found


def test_nothing_above_data_indexes_a_manifest_by_key():
  bad = []
  for path in sorted(PACKAGE.rglob('*.py')):
    if (PACKAGE / 'data') in path.parents:
      continue
    text = path.read_text()
    bad += [f'{path.relative_to(PACKAGE)}:{n}' for n in _string_key_reads(ast.parse(text))]
    if 'manifest.json' in text.replace('(holds manifest.json)', ''):
      bad.append(f'{path.relative_to(PACKAGE)}: reads manifest.json itself (use shards.Manifest.read)')
  assert not bad, bad


def test_the_check_sees_a_key_read():
  assert _string_key_reads(ast.parse("manifest['tokenizer']\nm.raw\nsource_manifest.get('x')")) == [1, 2, 3]


def test_written_and_read_back_the_same(tmp_path):
  docs = synthetic_data.synthetic_documents(20, seed=0, max_len=40, vocab_size=500)
  made = synthetic_data.write_prepared(str(tmp_path), docs, vocab_size=500, max_length=64)
  m = shards.Manifest.read(str(tmp_path))
  assert m == shards.Manifest.of(made) and m.vocab_size == 500 and m.max_length == 64
  assert m.records('train') == sum(s['records'] for s in made['splits']['train']['shards'])
  assert (tmp_path / shards.MANIFEST).read_text() == m.text()


@pytest.mark.parametrize(
  ('body', 'message'),
  [(None, 'no manifest.json'), (b'{not json', 'unreadable manifest'), (b'{"format": "x/v0"}', "format 'x/v0'")],
)
def test_a_missing_old_or_corrupt_manifest_is_one_line_naming_the_fix(tmp_path, body, message):
  if body is not None:
    (tmp_path / shards.MANIFEST).write_bytes(body)
  with pytest.raises(errors.DataError) as e:
    shards.Manifest.read(str(tmp_path))
  assert message in str(e.value) and '\n' not in str(e.value), e.value
  assert 'prepare' in str(e.value)


def test_older_data_with_record_indexes_reads_and_a_damaged_index_entry_is_one_line(tmp_path):
  """Data prepared when prepare wrote a record index beside each shard: the manifest still reads, the index travels
  with its shard (files(): what publishing copies), and a damaged index entry is one DataError, not a KeyError."""
  import json

  synthetic_data.write_prepared(str(tmp_path), synthetic_data.synthetic_documents(20, seed=0, max_len=50))
  raw = json.loads((tmp_path / shards.MANIFEST).read_text())
  shard = raw['splits']['train']['shards'][0]
  shard['index'] = {'file': shard['file'] + '.index', 'bytes': 10, 'sha256': '0' * 64}
  (tmp_path / shards.MANIFEST).write_text(json.dumps(raw))
  assert shard['file'] + '.index' in shards.Manifest.read(str(tmp_path)).files()
  shard['index'] = {'file': 3, 'bytes': 10, 'sha256': '0' * 64}
  (tmp_path / shards.MANIFEST).write_text(json.dumps(raw))
  with pytest.raises(errors.DataError, match='damaged manifest') as e:
    shards.Manifest.read(str(tmp_path))
  assert '\n' not in str(e.value)
