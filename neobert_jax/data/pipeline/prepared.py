"""Opening prepared data: finding it (a local directory, a bucket, or the built-in corpus), checking that it fits
the run (tokenizer, vocabulary), listing a split's shards, and the store a process reads them through; and, for the
reports, a split read on one process. Opening reads only manifests and never tokenizes (`prepare_builtin` does).
"""

import dataclasses

import ml_collections
import numpy as np

from neobert_jax import errors, paths
from neobert_jax.config import data as data_config
from neobert_jax.data import mixture as mixture_lib
from neobert_jax.data import shards
from neobert_jax.data import tokenizer as tokenizer_lib
from neobert_jax.data.pipeline import store as store_lib


def prepare_builtin(data_cfg: ml_collections.ConfigDict, seq_len: int) -> None:
  """Fetches and tokenizes the built-in corpus (data.dir empty) once per machine: the train command's first step."""
  if not data_cfg.dir and not data_cfg.mixture:
    _builtin_dir(data_cfg, seq_len, build=True)


def _builtin_dir(data_cfg: ml_collections.ConfigDict, seq_len: int, build: bool = False) -> str:
  from neobert_jax.data.prepare import corpus  # pylint: disable=g-import-not-at-top

  tokenizer = data_cfg.tokenizer or tokenizer_lib.BUILTIN_BERT
  return corpus.default_prepared_dir(max_length=seq_len, tokenizer=tokenizer, build=build)


def open_prepared(
  data_cfg: ml_collections.ConfigDict, seq_len: int, model_vocab_size: int | None = None
) -> tuple[str, shards.Manifest]:
  """Finds the prepared data and checks it fits this run; returns (its directory or bucket URL, manifest). The
  built-in corpus (data.dir empty) must have been prepared (prepare_builtin); else the error names the command."""
  data_config.validate_data_config(data_cfg)
  directory = data_cfg.dir or _builtin_dir(data_cfg, seq_len)
  if paths.is_url(directory):
    directory = str(paths.resolve(directory, 'data.dir'))
  manifest = shards.Manifest.read(directory)
  ident = manifest.tokenizer
  # The manifest's own spec (what a run records as its tokenizer) names that vocabulary by definition, and need not
  # be loadable here (a vocabulary learned on the machine that prepared the data).
  if data_cfg.tokenizer and data_cfg.tokenizer != ident['spec']:
    want = tokenizer_lib.load_tokenizer(data_cfg.tokenizer).identity()
    if not tokenizer_lib.same_vocabulary(want, ident):
      raise errors.DataError(
        f'{directory} was prepared with tokenizer {ident["spec"]!r} ({ident["kind"]}, '
        f'{ident["vocab_size"]} ids), not data.tokenizer={data_cfg.tokenizer!r} '
        f'({want["kind"]}, {want["vocab_size"]} ids); prepare it again with that tokenizer'
      )
  if model_vocab_size is not None and model_vocab_size != ident['vocab_size']:
    raise errors.DataError(
      f'{directory} uses a {ident["vocab_size"]}-id vocabulary ({ident["spec"]!r}) but the '
      f'model has vocab_size={model_vocab_size}; they must match'
    )
  return directory, manifest


def read_mixture(data_cfg: ml_collections.ConfigDict, seq_len: int) -> mixture_lib.Mixture:
  """What the run trains on: data.mixture, else data.dir (or the built-in corpus's) as a mixture of one."""
  if data_cfg.mixture:
    return mixture_lib.read(data_cfg.mixture)
  return mixture_lib.Mixture.of_dir(data_cfg.dir or _builtin_dir(data_cfg, seq_len))


@dataclasses.dataclass(frozen=True)
class Sources:
  """The run's training data, opened: its mixture (mixture.py) and each source's (directory, manifest)."""

  mix: mixture_lib.Mixture
  opened: dict[str, tuple[str, shards.Manifest]]

  def tokenizer(self) -> str:
    """The tokenizer spec the data was prepared with (every source shares it: mixture.open_sources)."""
    return next(iter(self.opened.values()))[1].spec

  def records(self, count: int) -> dict[str, int]:
    """Each source's training records per virtual shard (an epoch of one) for `count` virtual shards."""
    return {n: m.records('train') // count for n, (_, m) in self.opened.items()}

  def block_docs(self, block_docs: int, given: str, count: int) -> dict[str, int]:
    """Each source's documents per block: `given` (data.mixture_block_docs), else as Mixture.block_docs says."""
    return self.mix.block_docs(block_docs, given, self.records(count))

  def config(
    self, data_cfg: ml_collections.ConfigDict, name: str, share_cache: bool = True
  ) -> ml_collections.ConfigDict:
    """The data section that reads source `name`: its directory and, with `share_cache`, its share of the cache."""
    return data_config.source_config(data_cfg, self.opened[name][0], len(self.opened) if share_cache else 1)

  def with_eval(self) -> list[str]:
    """The sources that have a held-out split."""
    return [n for n, (_, m) in self.opened.items() if m.shards('eval')]


def open_data(
  data_cfg: ml_collections.ConfigDict,
  seq_len: int,
  model_vocab_size: int | None = None,
  mix: mixture_lib.Mixture | None = None,
) -> Sources:
  """The sources of `mix` (default: read_mixture), each opened by open_prepared and checked against the others."""
  mix = mix or read_mixture(data_cfg, seq_len)
  n = len(mix.sources)
  opened = mixture_lib.open_sources(
    mix, lambda d: open_prepared(data_config.source_config(data_cfg, d, n), seq_len, model_vocab_size), seq_len
  )
  return Sources(mix, opened)


def split_shards(directory: str, manifest: shards.Manifest, split: str) -> list[dict]:
  """The manifest's shard list of `split`; DataError when the split holds no documents."""
  if not manifest.shards(split):
    raise errors.DataError(f'{directory}: split {split!r} holds no documents')
  return manifest.shards(split)


def open_store(
  directory: str, manifest: shards.Manifest, split: str, listed: list[dict], cache_gb: float, process_index: int
):
  """The store this process reads `listed` shards of `split` through: in place, or a bucket's bounded cache."""
  if paths.is_url(directory):
    budget = int(min(cache_gb, 2**40) * 2**30)
    return store_lib.BucketStore(
      paths.resolve(directory, 'data.dir'), listed, budget, process_index, manifest.version(), split
    )
  return store_lib.LocalStore(directory, listed)


def read_heldout_split(
  data_cfg: ml_collections.ConfigDict, seq_len: int, split: str, max_tokens: int | None = None
) -> tuple[list[np.ndarray], shards.Manifest]:
  """(the split's documents as int32 arrays in order, its manifest), at most ~max_tokens; from a bucket each file
  is fetched when reached and released after, so the cache budget holds."""
  directory, manifest = open_prepared(data_cfg, seq_len)
  listed = split_shards(directory, manifest, split)
  store = open_store(directory, manifest, split, listed, data_cfg.cache_gb, 0)
  records, tokens = [], 0
  for shard in listed:
    if max_tokens is not None and tokens >= max_tokens:
      break  # before the next file is fetched
    name, n = shard['file'], shard['records']
    step = 1024 if max_tokens is not None else max(n, 1)  # a whole split is read in one call per file
    store.acquire([name])
    for start in range(0, n, step):
      if max_tokens is not None and tokens >= max_tokens:
        break
      chunk = [shards.decode(r, manifest.id_dtype) for r in store.read(name, list(range(start, min(start + step, n))))]
      records += chunk
      tokens += sum(c.size for c in chunk)
    store.release([name])
  return records, manifest
