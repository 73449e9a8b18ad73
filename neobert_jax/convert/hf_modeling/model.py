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

Unpadding: a padded batch (an ``attention_mask`` with zeros) and packed rows (``segment_ids`` or ``cu_seqlens``) are
computed on their real tokens only. The tokens are gathered into one [tokens, hidden] matrix for every projection,
norm and feed-forward, document after document (a row, or a packed document); attention runs per group of documents
(sorted by length; documents of equal length share a call, and documents of unequal length share one only where
padding them costs less than a call of their own, which on a CPU means short ones), so no [T, T] mask is built.
The results are scattered back, so padded positions of ``last_hidden_state`` and ``logits`` are zeros. Outputs equal
the padded computation within float32 rounding. ``config.unpad_inputs = False`` switches this off;
``output_attentions`` and ``torch.onnx`` / ``torch.export`` tracing use the padded computation (fixed shapes, a
boolean key mask).

Half precision: masks are boolean, and a row with no real token attends to every position, so no softmax row is
ever fully masked: padded and fully padded rows stay finite in float16 and bfloat16, forward and backward.

Gradient checkpointing (``model.gradient_checkpointing_enable()``) recomputes each block in the backward pass.
"""

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput


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
        max_length: int = 1024,
        embedding_init_range: float = 0.02,
        decoder_init_range: float = 0.02,
        classifier_init_range: float = 0.02,
        classifier_dropout: float = 0.1,
        tie_word_embeddings: bool = False,
        unpad_inputs: bool = True,
        **kwargs,
    ):
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
        self.max_length = max_length
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


class EncoderBlock(nn.Module):
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
        output_attentions: bool = False,
        rows: Optional["UnpaddedRows"] = None,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x: [B, T, D] padded rows (``mask`` as from NeoBERT._padded_mask), or [tokens, D] with ``rows``."""
        qkv = self.qkv(self.attention_norm(x))
        weights = None
        if rows is None:
            batch, length = x.shape[:2]
            q, k, v = qkv.view(batch, length, self.num_heads, 3 * self.head_dim).chunk(3, dim=-1)
            q = apply_rotary(q, cos, sin).transpose(1, 2)  # [B, H, T, Dh]
            k = apply_rotary(k, cos, sin).transpose(1, 2)
            v = v.transpose(1, 2)
            if output_attentions:
                scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                weights = scores.float().softmax(dim=-1).to(q.dtype)
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


def _tracing() -> bool:
    """True under torch.export / torch.onnx / torch.jit tracing, which need the fixed-shape padded computation."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_exporting") and compiler.is_exporting():
        return True
    return torch.jit.is_tracing()


# What one more attention call costs, in query x key positions of padding it would be worth computing instead. On
# a 2-core CPU a call's fixed cost (~40 us) is about a 40 x 40 block of attention. On a GPU a launch and its Python
# are worth a whole row of 1024 at flash-attention speed, so rows up to that length share one masked call there (an
# estimate: not yet measured on a GPU).
ATTENTION_CALL_COST = {"cpu": 40 * 40}
ATTENTION_CALL_COST_DEFAULT = 1024 * 1024


class UnpaddedRows:
    """Where the real tokens of a padded or packed batch go: gathered into [tokens, D] for the dense layers, one
    document after another (longest first; a document is a row, or in packed rows the tokens of a row that share a
    segment id), and cut into attention groups of documents.

    Consecutive documents share an attention call when padding the shorter ones to the group's longest costs less
    than a call of their own (``call_cost``, in query x key positions): on a CPU, documents of equal length share a
    call and documents of different lengths each get their own, unmasked, so no padding is computed. A group of equal
    lengths is a view of the token matrix; a group of unequal lengths is copied into its padded layout with a key
    mask. ``groups`` lists (start, stop, length, slots or None, key mask or None): the group's tokens [start, stop),
    its longest document, and for an unequal group each token's position in the padded [documents * length] layout.
    Rows without tokens are left out (their outputs are scattered back as zeros). Built once per forward: the blocks
    do no per-document Python work.
    """

    def __init__(
        self, valid: torch.Tensor, documents: Optional[torch.Tensor] = None, call_cost: Optional[int] = None
    ):
        batch, length = valid.shape
        if call_cost is None:
            call_cost = ATTENTION_CALL_COST.get(valid.device.type, ATTENTION_CALL_COST_DEFAULT)
        flat = valid.flatten().nonzero().squeeze(1)  # the real tokens' places in the flattened batch, in order
        key = torch.div(flat, length, rounding_mode="floor")  # each token's row
        if documents is not None and flat.numel():  # packed rows: a document is a (row, id) pair
            ids = documents.flatten()[flat]
            ids = ids - ids.min()
            key = key * (int(ids.max()) + 1) + ids
        _, document, counts = torch.unique(key, return_inverse=True, return_counts=True)
        by_length = torch.argsort(counts, descending=True, stable=True)
        rank = torch.empty_like(by_length)
        rank[by_length] = torch.arange(by_length.numel(), device=valid.device)
        # Tokens by their document's rank (longest first), then by place: each document's tokens lie together.
        self.index = flat[torch.argsort(rank[document] * (batch * length) + flat)]  # [tokens]
        sorted_lengths = counts[by_length].tolist()
        self.groups = []
        start, i = 0, 0
        while i < len(sorted_lengths):
            longest = sorted_lengths[i]
            j = i + 1
            while j < len(sorted_lengths) and longest**2 - sorted_lengths[j] ** 2 <= call_cost:
                j += 1
            group = sorted_lengths[i:j]
            stop = start + sum(group)
            slots, group_mask = None, None
            if group[-1] != longest:
                group_lengths = torch.tensor(group, device=valid.device)
                row_of_token = torch.repeat_interleave(torch.arange(len(group), device=valid.device), group_lengths)
                row_start = torch.cumsum(group_lengths, 0) - group_lengths
                place = torch.arange(stop - start, device=valid.device) - row_start[row_of_token]
                slots = row_of_token * longest + place
                group_mask = (torch.arange(longest, device=valid.device)[None] < group_lengths[:, None])[:, None, None]
            self.groups.append((start, stop, longest, slots, group_mask))
            start, i = stop, j
        self.batch, self.length = batch, length

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] -> [tokens, ...]"""
        return x.flatten(0, 1).index_select(0, self.index)

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """[tokens, ...] -> [B, T, ...], zeros at padded positions."""
        out = x.new_zeros((self.batch * self.length,) + tuple(x.shape[1:]))
        return out.index_copy(0, self.index, x).unflatten(0, (self.batch, self.length))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Bidirectional attention within each document: q, k, v [tokens, H, Dh] (any strides) -> [tokens, H * Dh]."""
        outputs = []
        for start, stop, length, slots, group_mask in self.groups:
            if slots is None:  # equal lengths: [rows * length] tokens are [rows, length] as they lie
                q_g, k_g, v_g = (t[start:stop].unflatten(0, (-1, length)).transpose(1, 2) for t in (q, k, v))
            else:
                rows = group_mask.shape[0]
                q_g, k_g, v_g = (
                    t.new_zeros((rows * length,) + tuple(t.shape[1:])).index_copy(0, slots, t[start:stop])
                    .unflatten(0, (rows, length)).transpose(1, 2)
                    for t in (q, k, v)
                )
            out = F.scaled_dot_product_attention(q_g, k_g, v_g, attn_mask=group_mask, dropout_p=0.0)
            out = out.transpose(1, 2).flatten(0, 1)  # [rows * length, H, Dh]
            outputs.append(out if slots is None else out.index_select(0, slots))
        if not outputs:  # every row is empty
            return q.new_zeros((0, q.shape[1] * q.shape[2]))
        attn = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        return attn.flatten(1)


def segment_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[total] 1-based document ids from cumulative boundaries [0, l0, l0+l1, ...]; tokens past the end get 0."""
    cu = cu_seqlens.to(torch.long).flatten()
    if cu.numel() < 2 or int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > total:
        raise ValueError(
            f"cu_seqlens must start at 0, be non-decreasing and end at most at the sequence length {total}; "
            f"got {cu.tolist()}"
        )
    index = torch.arange(total, device=cu.device)
    doc = torch.searchsorted(cu[1:], index, right=True) + 1
    return torch.where(index < cu[-1], doc, torch.zeros_like(doc))


def positions_from_segment_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 where the segment id changes (each contiguous run counts from 0)."""
    length = segment_ids.shape[-1]
    index = torch.arange(length, device=segment_ids.device).expand_as(segment_ids)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[..., 1:] = segment_ids[..., 1:] != segment_ids[..., :-1]
    run_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - run_start


class NeoBERTPreTrainedModel(PreTrainedModel):
    config_class = NeoBERTConfig
    base_model_prefix = "model"
    _no_split_modules = ["EncoderBlock"]
    _supports_sdpa = True
    supports_gradient_checkpointing = True

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
    """The encoder: returns ``last_hidden_state`` [B, T, D] after the final RMSNorm."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.encoder = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.transformer_encoder = nn.ModuleList(EncoderBlock(config) for _ in range(config.num_hidden_layers))
        self.layer_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.gradient_checkpointing = False  # set by gradient_checkpointing_enable()
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

    def _unpadded_rows(
        self, real: Optional[torch.Tensor], segment_ids: Optional[torch.Tensor], output_attentions: bool
    ) -> Optional[UnpaddedRows]:
        """The unpadded layout (inputs as from _masking_inputs) when it pays: packed rows, or a batch with padding.
        None means the padded computation."""
        if output_attentions or not getattr(self.config, "unpad_inputs", True) or _tracing():
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
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        segment_ids: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ):
        """(final hidden states: [B, T, D], or [tokens, D] when unpadded; the UnpaddedRows or None; hidden states
        per layer [B, T, D] or None; attention weights or None)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        x = self.encoder(input_ids) if input_ids is not None else inputs_embeds
        batch, length = x.shape[:2]
        real, segment_ids = self._masking_inputs(batch, length, x.device, attention_mask, segment_ids, cu_seqlens)
        rows = self._unpadded_rows(real, segment_ids, output_attentions)
        mask = self._padded_mask(real, segment_ids) if rows is None else None
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

        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        checkpointing = getattr(self, "gradient_checkpointing", False) and self.training and torch.is_grad_enabled()
        for block in self.transformer_encoder:
            if checkpointing:
                x, weights = torch.utils.checkpoint.checkpoint(
                    block, x, cos, sin, mask, output_attentions, rows, use_reentrant=False
                )
            else:
                x, weights = block(x, cos, sin, mask, output_attentions, rows)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(weights)
        x = self.layer_norm(x)
        if output_hidden_states and rows is not None:
            hidden_states = [rows.scatter(h) for h in hidden_states]
        return x, rows, hidden_states, attentions

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
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ) -> Union[BaseModelOutput, Tuple]:
        # token_type_ids (produced by BERT tokenizers) and max_seqlen are accepted and ignored.
        x, rows, hidden_states, attentions = self._encode(
            input_ids, attention_mask, position_ids, segment_ids, cu_seqlens, inputs_embeds,
            bool(output_hidden_states), bool(output_attentions),
        )
        output = BaseModelOutput(
            last_hidden_state=x if rows is None else rows.scatter(x),
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )
        return output if return_dict is not False else output.to_tuple()


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
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ) -> Union[MaskedLMOutput, Tuple]:
        """labels [B, T]: target token id where the loss is taken, -100 elsewhere."""
        x, rows, hidden_states, attentions = self.model._encode(
            input_ids, attention_mask, position_ids, segment_ids, cu_seqlens, inputs_embeds,
            bool(output_hidden_states), bool(output_attentions),
        )
        logits = self.decoder(x)  # only the real tokens' when the batch was unpadded
        if rows is not None:
            logits = rows.scatter(logits)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.shape[-1]).float(), labels.to(logits.device).view(-1), ignore_index=-100
            )
        output = MaskedLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )
        return output if return_dict is not False else output.to_tuple()


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
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ) -> Union[SequenceClassifierOutput, Tuple]:
        if segment_ids is not None or cu_seqlens is not None:
            raise ValueError("sequence classification pools the first token of each row: pass unpacked rows")
        encoded = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
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
        return output if return_dict is not False else output.to_tuple()
