"""Our PyTorch NeoBERT (``hf_modeling/model.py``) from a neobert-jax flat param dict (imports torch)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from neobert_jax.convert.hf_modeling import model as hf_model
from neobert_jax.weights import hf


def torch_model_from_flat(
  flat: Mapping[str, Any], cfg: Any, dtype: str | torch.dtype = 'float32', cls=hf_model.NeoBERTLMHead
) -> torch.nn.Module:
  """Our ``NeoBERTLMHead`` (or ``cls``) holding ``flat``'s weights, in eval mode; built on the meta device, so a
  250M model costs one copy."""
  dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # 'float32', 'bfloat16', ...
  # Through a float32 copy: torch has no bfloat16 of numpy's (ml_dtypes), and the tensors never alias `flat`.
  state = {
    k: torch.from_numpy(np.array(v, np.float32)).to(dtype) for k, v in hf.flat_to_hf_state_dict(flat, cfg).items()
  }
  fields = {k: v for k, v in hf.hf_config_dict(cfg).items() if k not in ('architectures', 'auto_map', 'model_type')}
  with torch.device('meta'):
    model = cls(hf_model.NeoBERTConfig(**fields))  # the exported config.json's fields
  if cls is hf_model.NeoBERTModel:
    state = {k[len(hf.HF_PREFIX) :]: v for k, v in state.items() if k.startswith(hf.HF_PREFIX)}
  elif 'decoder.bias' in state and 'decoder.weight' not in state:
    # A tied decoder (model.tie_word_embeddings): its weight is the embedding's, tied again after the assignment.
    state['decoder.weight'] = state['model.encoder.weight']
  model.load_state_dict(state, strict=True, assign=True)
  model.tie_weights()
  return model.eval()
