"""A NeoBERT in JAX as an `mteb` encoder, no export: texts are embedded by `embed.Encoder`, so the vectors are exactly
the `embed` command's; a text repeated within one call is embedded once. Similarity is cosine, as in the paper."""

from __future__ import annotations

from typing import Any

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction

from neobert_jax import embed
from neobert_jax.weights import source as source_lib


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
