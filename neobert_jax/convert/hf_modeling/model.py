"""NeoBERT in PyTorch for Hugging Face ``transformers`` (written for neobert-jax).

This file has two jobs:

* it is the independent PyTorch reference that neobert-jax's parity tests compare the JAX model against, and
* it is copied verbatim as ``model.py`` into every exported Hugging Face directory, where
  ``AutoModel*.from_pretrained(dir, trust_remote_code=True)`` loads it through ``auto_map``.

It therefore imports nothing but ``torch`` and ``transformers`` (and the standard library).

Architecture (the released NeoBERT, ``chandar-lab/NeoBERT``): token embedding, N pre-RMSNorm encoder blocks
(fused per-head ``qkv`` projection, rotary position embedding on adjacent pairs, bidirectional scaled dot-product
attention, ``wo``; SwiGLU feed-forward with a fused ``w12`` whose first half is the gate, ``w3``), a final RMSNorm,
and for masked language modelling an untied ``decoder`` Linear with bias. No biases inside the encoder, no dropout.

Attention masking, pick one (all optional):

* ``attention_mask`` [B, T]: 1 = token, 0 = padding (padding keys are ignored);
* ``segment_ids`` [B, T]: packed rows, 1-based document id per token, 0 = padding; a token attends only to tokens
  of its own document. Positions restart at 0 for each document unless ``position_ids`` is given;
* ``cu_seqlens`` [n_docs + 1] (with ``input_ids`` of shape [1, total]): the flash-attention style description of
  the same packing (cumulative document boundaries); ``max_seqlen`` is accepted and unused.

Unpadding (``unpadding.py``, shipped beside this file): a padded batch (an ``attention_mask`` with zeros) and packed
rows (``segment_ids`` or ``cu_seqlens``) are computed on their real tokens only, with attention per document, and
scattered back. The padded computation (a boolean key mask, fixed shapes) runs instead when the attention must be an
explicit softmax (``attn_implementation="eager"``, ``output_attentions``, ``head_mask``), under ``torch.onnx`` /
``torch.export`` / ``torch.jit`` tracing, and with ``config.unpad_inputs = False``. Every path returns zeros at
padded positions of ``last_hidden_state``, ``hidden_states`` and ``logits``, and they agree within float32 rounding.

The transformers conventions: ``output_hidden_states``, ``output_attentions`` and ``return_dict`` left None take the
config's value, and ``return_dict=False`` (or 4.x's ``torchscript=True``) returns tuples. ``attn_implementation`` is
"sdpa" (the default) or "eager"; transformers refuses the others. ``head_mask`` ([heads] or [layers, heads])
multiplies the eager attention weights. ``max_position_embeddings`` is the longest sequence trained on (read from
``max_length`` in older exports).

Half precision: masks are boolean, and a row with no real token attends to every position, so no softmax row is
ever fully masked: padded and fully padded rows stay finite in float16 and bfloat16, forward and backward.

Gradient checkpointing: every block is a ``GradientCheckpointingLayer``, switched on by
``gradient_checkpointing_enable()`` (4.x), ``activation_checkpointing_enable()`` (5.x) or ``gradient_checkpointing``
in the config.
"""

import math
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

from .unpadding import (  # noqa: F401  (ATTENTION_CALL_COST: tests and benchmarks set it through this module)
    ATTENTION_CALL_COST,
    UnpaddedRows,
    positions_from_segment_ids,
    segment_ids_from_cu_seqlens,
)
from .unpadding import tracing as _tracing


def swiglu_hidden_size(intermediate_size: int, multiple_of: int = 8) -> int:
    """Width of the SwiGLU hidden layer: two thirds of ``intermediate_size``, rounded up to ``multiple_of``."""
    two_thirds = int(2 * intermediate_size / 3)
    return multiple_of * ((two_thirds + multiple_of - 1) // multiple_of)


class NeoBERTConfig(PretrainedConfig):
    model_type = "neobert"

    def __init__(
        self,
        hidden_size: int = 768,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        dim_head: Optional[int] = None,
        norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        vocab_size: int = 30522,
        pad_token_id: int = 0,
        max_position_embeddings: Optional[int] = None,
        embedding_init_range: float = 0.02,
        decoder_init_range: float = 0.02,
        classifier_init_range: float = 0.02,
        classifier_dropout: float = 0.1,
        tie_word_embeddings: bool = False,
        unpad_inputs: bool = True,
        **kwargs,
    ):
        # The longest sequence trained on. Exports written before neobert-jax issue 37 (and the published
        # chandar-lab/NeoBERT) call it max_length, which transformers 5 takes for a generation parameter and then
        # refuses to save: the old name is read, never kept.
        legacy_max_length = kwargs.pop("max_length", None)
        if max_position_embeddings is None:
            max_position_embeddings = legacy_max_length if legacy_max_length is not None else 1024
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
        if hidden_size % num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})"
            )
        derived_dim_head = hidden_size // num_attention_heads
        if dim_head is not None and dim_head != derived_dim_head:
            raise ValueError(
                f"dim_head={dim_head} does not match hidden_size // num_attention_heads = {derived_dim_head}; "
                "NeoBERT requires dim_head * num_attention_heads == hidden_size"
            )
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.dim_head = derived_dim_head
        self.norm_eps = norm_eps
        self.rope_theta = rope_theta
        self.vocab_size = vocab_size
        self.max_position_embeddings = int(max_position_embeddings)
        self.embedding_init_range = embedding_init_range
        self.decoder_init_range = decoder_init_range
        self.classifier_init_range = classifier_init_range
        self.classifier_dropout = classifier_dropout
        self.unpad_inputs = unpad_inputs


class RMSNorm(nn.Module):
    """RMS normalisation with a learned scale; the statistics and the scaling are computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(F, "rms_norm"):  # torch >= 2.4: one kernel instead of five
            return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * inv_rms * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, float32, shape positions.shape + (head_dim // 2,)."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponent)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of the last axis as complex numbers by the angle of pair i.

    x: [B, T, H, Dh]; cos, sin: [B, T, Dh/2] (or broadcastable to it). Computed in float32.
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    cos = cos.unsqueeze(-2)  # broadcast over heads
    sin = sin.unsqueeze(-2)
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def apply_rotary_qk(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary on q and k at once, as one complex multiplication: qk [tokens, H, 2, Dh], cos, sin [tokens, Dh/2].

    The same rotation of the same pairs as apply_rotary, in float32; one kernel instead of several elementwise ones
    (complex numbers cannot be traced to ONNX, so the padded, traceable path keeps apply_rotary).
    """
    pairs = torch.view_as_complex(qk.float().unflatten(-1, (-1, 2)))
    turns = torch.complex(cos, sin)[:, None, None, :]  # broadcast over heads and over q / k
    return torch.view_as_real(pairs * turns).flatten(-2).to(qk.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden, bias=False)  # rows [0, hidden) are the gate
        self.w3 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w12(x).chunk(2, dim=-1)
        if torch.is_grad_enabled() or _tracing():
            return self.w3(F.silu(gate) * up)
        # Eager inference: the activation overwrites the gate's half of w12's output, so no new [tokens, hidden]
        # buffer is allocated and filled. (Autograd needs both halves kept; a traced graph would turn the in-place
        # write into a scatter into the whole output.)
        return self.w3(F.silu(gate, inplace=True).mul_(up))


class EncoderBlock(GradientCheckpointingLayer):
    """One pre-norm block. A GradientCheckpointingLayer: ``gradient_checkpointing_enable()`` (4.x) and
    ``activation_checkpointing_enable()`` (5.x) make it recompute itself in the backward pass."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.dim_head
        dim = config.hidden_size
        self.attention_norm = RMSNorm(dim, config.norm_eps)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)  # rows grouped per head: [q_h | k_h | v_h]
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = RMSNorm(dim, config.norm_eps)
        self.ffn = SwiGLU(dim, swiglu_hidden_size(config.intermediate_size))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: Optional[torch.Tensor],
        rows: Optional[UnpaddedRows] = None,
        eager: bool = False,
        head_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x: [B, T, D] padded rows (``mask`` as from NeoBERT._padded_mask), or [tokens, D] with ``rows``.

        ``eager``: the padded rows' attention as an explicit softmax, whose weights (times ``head_mask`` [1, H, 1, 1],
        when given) are returned; else scaled_dot_product_attention, and None for the weights."""
        qkv = self.qkv(self.attention_norm(x))
        weights = None
        if rows is None:
            batch, length = x.shape[:2]
            q, k, v = qkv.view(batch, length, self.num_heads, 3 * self.head_dim).chunk(3, dim=-1)
            q = apply_rotary(q, cos, sin).transpose(1, 2)  # [B, H, T, Dh]
            k = apply_rotary(k, cos, sin).transpose(1, 2)
            v = v.transpose(1, 2)
            if eager:
                scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                weights = scores.float().softmax(dim=-1).to(q.dtype)
                if head_mask is not None:
                    weights = weights * head_mask.to(weights.dtype)
                attn = weights @ v
            else:
                attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
            attn = attn.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        else:
            qkv = qkv.view(-1, self.num_heads, 3, self.head_dim)
            qk = apply_rotary_qk(qkv[:, :, :2], cos, sin)
            attn = rows.attend(qk[:, :, 0], qk[:, :, 1], qkv[:, :, 2])
        x = x + self.wo(attn)
        x = x + self.ffn(self.ffn_norm(x))
        return x, weights


class NeoBERTPreTrainedModel(PreTrainedModel):
    config_class = NeoBERTConfig
    base_model_prefix = "model"
    _no_split_modules = ["EncoderBlock"]
    # attn_implementation: "sdpa" (the default: scaled_dot_product_attention, unpadded) and "eager" (an explicit
    # softmax on the padded rows). transformers refuses the others (flash_attention_2, flex_attention) in one line.
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False
    supports_gradient_checkpointing = True

    def _output_options(
        self, output_hidden_states: Optional[bool], output_attentions: Optional[bool], return_dict: Optional[bool]
    ) -> Tuple[bool, bool, bool]:
        """The call's output flags, each falling back to the config's when None (the transformers convention; 4.x's
        use_return_dict is False under torchscript=True, so a traced model returns tuples)."""
        config = self.config
        if output_hidden_states is None:
            output_hidden_states = getattr(config, "output_hidden_states", False)
        if output_attentions is None:
            output_attentions = getattr(config, "output_attentions", False)
        if return_dict is None:
            return_dict = getattr(config, "use_return_dict", getattr(config, "return_dict", True))
        return bool(output_hidden_states), bool(output_attentions), bool(return_dict)

    def _init_weights(self, module: nn.Module) -> None:
        config = self.config
        if isinstance(module, nn.Linear):
            if getattr(module, "_neobert_classifier", False):
                nn.init.normal_(module.weight, mean=0.0, std=config.classifier_init_range)
            else:
                nn.init.uniform_(module.weight, -config.decoder_init_range, config.decoder_init_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.uniform_(module.weight, -config.embedding_init_range, config.embedding_init_range)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


class NeoBERT(NeoBERTPreTrainedModel):
    """The encoder: returns ``last_hidden_state`` [B, T, D] after the final RMSNorm (zeros at padded positions)."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.encoder = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.transformer_encoder = nn.ModuleList(EncoderBlock(config) for _ in range(config.num_hidden_layers))
        self.layer_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder = value

    def _masking_inputs(
        self,
        batch: int,
        length: int,
        device: torch.device,
        attention_mask: Optional[torch.Tensor],
        segment_ids: Optional[torch.Tensor],
        cu_seqlens: Optional[torch.Tensor],
    ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Checks the masking inputs. Returns (real tokens: boolean [B, T] on ``device``, or None when every token is
        real; packed segment ids [B, T] with 0 at padding, or None when the rows are not packed). A traced graph keeps
        an all-true mask: its inputs may have padding."""
        if segment_ids is not None and cu_seqlens is not None:
            raise ValueError("pass either segment_ids or cu_seqlens to describe packed rows, not both")
        if attention_mask is not None:
            if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, length):
                raise ValueError(
                    f"attention_mask must have shape {(batch, length)} (1 = token, 0 = padding), "
                    f"got {tuple(attention_mask.shape)}"
                )
            real = attention_mask.to(device) != 0
            attention_mask = None if not _tracing() and bool(real.all()) else real
        if cu_seqlens is not None:
            if batch != 1:
                raise ValueError(
                    f"cu_seqlens describes one packed row: input_ids must have shape [1, total], got batch {batch}"
                )
            segment_ids = segment_ids_from_cu_seqlens(cu_seqlens.to(device), length)[None]
        if segment_ids is not None:
            if tuple(segment_ids.shape) != (batch, length):
                raise ValueError(f"segment_ids must have shape {(batch, length)}, got {tuple(segment_ids.shape)}")
            segment_ids = segment_ids.to(device=device, dtype=torch.long)
            if attention_mask is not None:
                segment_ids = segment_ids * attention_mask.to(torch.long)
        return attention_mask, segment_ids

    def _head_masks(self, head_mask: Optional[torch.Tensor]) -> List[Optional[torch.Tensor]]:
        """Per layer, ``head_mask`` ([heads] for every layer, or [layers, heads]; 1 keeps a head, 0 silences it) as
        [1, heads, 1, 1], or Nones."""
        layers, heads = self.config.num_hidden_layers, self.config.num_attention_heads
        if head_mask is None:
            return [None] * layers
        if head_mask.dim() == 1:
            head_mask = head_mask[None].expand(layers, -1)
        if tuple(head_mask.shape) != (layers, heads):
            raise ValueError(
                f"head_mask must have shape ({heads},) or ({layers}, {heads}) (layers, heads), got {tuple(head_mask.shape)}"
            )
        return [m.view(1, heads, 1, 1) for m in head_mask]

    def _unpadded_rows(
        self, real: Optional[torch.Tensor], segment_ids: Optional[torch.Tensor], eager: bool
    ) -> Optional[UnpaddedRows]:
        """The unpadded layout (inputs as from _masking_inputs) when it pays and may run: packed rows, or a batch with
        padding, unless the attention must be the eager softmax. None means the padded computation."""
        if eager or not getattr(self.config, "unpad_inputs", True) or _tracing():
            return None
        if segment_ids is not None:
            return UnpaddedRows(segment_ids != 0, documents=segment_ids)
        return None if real is None else UnpaddedRows(real)

    def _padded_mask(self, real: Optional[torch.Tensor], segment_ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The padded computation's boolean mask, broadcastable to [B, H, T, T] (True = attend), or None."""
        if segment_ids is not None:
            # A token sees only tokens of its own document. Padding (id 0) sees only padding, which keeps its
            # (ignored) outputs finite instead of NaN from an all-masked softmax row.
            return segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
        if real is None:
            return None
        keys = real | ~real.any(dim=1, keepdim=True)  # a row without tokens attends to all: never all-masked
        if _tracing():  # ONNX's Attention op (opset 23) in onnxruntime wants the query axis spelled out
            return keys[:, None, None, :].expand(-1, -1, keys.shape[1], -1)
        return keys[:, None, None, :]

    def _encode(
        self,
        input_ids: Optional[torch.Tensor],
        attention_mask: Optional[torch.Tensor],
        position_ids: Optional[torch.Tensor],
        segment_ids: Optional[torch.Tensor],
        cu_seqlens: Optional[torch.Tensor],
        inputs_embeds: Optional[torch.Tensor],
        head_mask: Optional[torch.Tensor],
        output_hidden_states: bool,
        output_attentions: bool,
    ):
        """(final hidden states: [B, T, D], or [tokens, D] when unpadded; ``place``, which turns such a tensor into
        [B, T, ...] with zeros at padded positions; hidden states per layer, placed, or None; attention weights or
        None).

        Padded batches and packed rows are computed unpadded (UnpaddedRows), unless the attention must be the eager
        softmax (attn_implementation "eager", output_attentions, head_mask), ``config.unpad_inputs`` is False or the
        model is being traced: then the padded rows are, and padded positions are zeroed after, so every path returns
        the same tensors, traced graphs included."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        x = self.encoder(input_ids) if input_ids is not None else inputs_embeds
        batch, length = x.shape[:2]
        real, segment_ids = self._masking_inputs(batch, length, x.device, attention_mask, segment_ids, cu_seqlens)
        head_masks = self._head_masks(head_mask)
        eager = output_attentions or head_mask is not None or getattr(self.config, "_attn_implementation", None) == "eager"
        rows, mask, valid = self._unpadded_rows(real, segment_ids, eager), None, None
        if rows is None:
            mask = self._padded_mask(real, segment_ids)
            valid = real if segment_ids is None else segment_ids != 0

        def place(t: torch.Tensor) -> torch.Tensor:
            if rows is not None:
                return rows.scatter(t)
            return t if valid is None else t.masked_fill(~valid.view(valid.shape + (1,) * (t.dim() - 2)), 0)

        if position_ids is None:
            if segment_ids is not None:
                position_ids = positions_from_segment_ids(segment_ids)
            else:
                position_ids = torch.arange(length, device=x.device)[None].expand(batch, length)
        elif position_ids.dim() == 1:
            position_ids = position_ids[None].expand(batch, length)
        position_ids = position_ids.to(x.device)
        if rows is not None:
            # Gather the real tokens; their positions follow them.
            x = rows.gather(x)
            position_ids = rows.gather(position_ids)
        cos, sin = rotary_cos_sin(position_ids, self.config.dim_head, self.config.rope_theta)
        # Padded rows: padded positions are zeroed between blocks (no real token attends to them, so nothing real
        # changes), and the hidden states returned are the very tensors the next block reads.
        step = place if rows is None else (lambda t: t)

        x = step(x)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for block, layer_head_mask in zip(self.transformer_encoder, head_masks):
            x, weights = block(x, cos, sin, mask, rows, eager, layer_head_mask)
            x = step(x)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(weights)
        x = self.layer_norm(x)
        if output_hidden_states and rows is not None:
            hidden_states = [rows.scatter(h) for h in hidden_states]
        return x, place, None if hidden_states is None else tuple(hidden_states), None if attentions is None else tuple(attentions)

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        segment_ids: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        head_mask: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ) -> Union[BaseModelOutput, Tuple]:
        # token_type_ids (produced by BERT tokenizers) and max_seqlen are accepted and ignored.
        output_hidden_states, output_attentions, return_dict = self._output_options(
            output_hidden_states, output_attentions, return_dict
        )
        x, place, hidden_states, attentions = self._encode(
            input_ids, attention_mask, position_ids, segment_ids, cu_seqlens, inputs_embeds, head_mask,
            output_hidden_states, output_attentions,
        )
        output = BaseModelOutput(last_hidden_state=place(x), hidden_states=hidden_states, attentions=attentions)
        return output if return_dict else output.to_tuple()

class NeoBERTLMHead(NeoBERTPreTrainedModel):
    """NeoBERT with its masked-language-model decoder (a Linear with bias, not tied to the embedding)."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.model = NeoBERT(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.encoder

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.encoder = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.decoder = value

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        segment_ids: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        head_mask: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ) -> Union[MaskedLMOutput, Tuple]:
        """labels [B, T]: target token id where the loss is taken, -100 elsewhere."""
        output_hidden_states, output_attentions, return_dict = self._output_options(
            output_hidden_states, output_attentions, return_dict
        )
        x, place, hidden_states, attentions = self.model._encode(
            input_ids, attention_mask, position_ids, segment_ids, cu_seqlens, inputs_embeds, head_mask,
            output_hidden_states, output_attentions,
        )
        logits = place(self.decoder(x))  # the decoder runs on the real tokens only when the batch was unpadded
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.shape[-1]).float(), labels.to(logits.device).view(-1), ignore_index=-100
            )
        output = MaskedLMOutput(loss=loss, logits=logits, hidden_states=hidden_states, attentions=attentions)
        return output if return_dict else output.to_tuple()


class NeoBERTForSequenceClassification(NeoBERTPreTrainedModel):
    """hidden[:, 0] -> dropout -> dense (tanh) -> dropout -> classifier."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = NeoBERT(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.dense._neobert_classifier = True
        self.classifier._neobert_classifier = True
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.encoder

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.encoder = value

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        segment_ids: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        head_mask: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ) -> Union[SequenceClassifierOutput, Tuple]:
        output_hidden_states, output_attentions, return_dict = self._output_options(
            output_hidden_states, output_attentions, return_dict
        )
        if segment_ids is not None or cu_seqlens is not None:
            raise ValueError("sequence classification pools the first token of each row: pass unpacked rows")
        encoded = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            head_mask=head_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
        )
        pooled = self.dropout(encoded.last_hidden_state[:, 0])
        pooled = self.dropout(torch.tanh(self.dense(pooled)))
        logits = self.classifier(pooled)

        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            problem_type = self.config.problem_type
            if problem_type is None:
                if self.num_labels == 1:
                    problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    problem_type = "single_label_classification"
                else:
                    problem_type = "multi_label_classification"
                self.config.problem_type = problem_type
            if problem_type == "regression":
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.squeeze(-1).float())
            elif problem_type == "single_label_classification":
                loss = F.cross_entropy(logits.view(-1, self.num_labels).float(), labels.view(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        output = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=encoded.hidden_states, attentions=encoded.attentions
        )
        return output if return_dict else output.to_tuple()
