"""The original padded NeoBERT forward, the reference the tests and benchmarks/export_inference.py check our PyTorch
model's unpadded computation against (docs/export.md, "Unpadding")."""

from __future__ import annotations

import torch

from neobert_jax.convert.hf_modeling import model as hf_model
from neobert_jax.weights import hf


def flat_from_torch_model(model: torch.nn.Module, cfg) -> dict:
  """The flat param dict of a ``NeoBERTLMHead`` (inverse of convert/torch_ref.torch_model_from_flat)."""
  return hf.hf_state_dict_to_flat({k: hf.torch_to_numpy(v) for k, v in model.state_dict().items()}, cfg)


def padded_reference_forward(
  model: hf_model.NeoBERTModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
  """``last_hidden_state`` computed as the published chandar-lab/NeoBERT model.py does (every padded position,
  a dense additive float mask), with ``model``'s weights and none of its forward code: the reference the unpadded
  export is checked against.
  """
  cfg = model.config
  x = model.encoder(input_ids)
  batch, length, dim = x.shape
  heads, head_dim = cfg.num_attention_heads, cfg.dim_head
  mask = None
  if attention_mask is not None:
    keep = (attention_mask != 0)[:, None, None, :].expand(batch, heads, length, length)
    mask = torch.zeros(keep.shape, dtype=x.dtype, device=x.device).masked_fill(~keep, torch.finfo(x.dtype).min)
  positions = torch.arange(length, device=x.device)[None].expand(batch, length)
  cos, sin = hf_model.rotary_cos_sin(positions, head_dim, cfg.rope_theta)
  for block in model.transformer_encoder:
    qkv = block.qkv(block.attention_norm(x)).view(batch, length, heads, 3 * head_dim)
    q, k, v = qkv.chunk(3, dim=-1)
    q = hf_model.apply_rotary(q, cos, sin).transpose(1, 2)
    k = hf_model.apply_rotary(k, cos, sin).transpose(1, 2)
    attn = torch.nn.functional.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=mask)
    x = x + block.wo(attn.transpose(1, 2).reshape(batch, length, dim))
    h = block.ffn_norm(x)
    gate, up = block.ffn.w12(h).chunk(2, dim=-1)
    x = x + block.ffn.w3(torch.nn.functional.silu(gate) * up)
  return model.layer_norm(x)
