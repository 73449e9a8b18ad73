"""NeoBERT in PyTorch for Hugging Face ``transformers`` (written for neobert-jax).

Both the independent reference of the parity tests and the ``model.py`` of every exported directory, loaded
through ``auto_map`` with ``trust_remote_code=True``: so it imports nothing but ``torch`` and ``transformers``.
Padded batches and packed rows (``segment_ids`` or ``cu_seqlens``) run on their real tokens only
(``unpadding.py``); eager attention, ``head_mask`` and ``config.unpad_inputs = False`` run the padded computation.
Every path returns zeros at padded positions, and boolean masks keep fully padded rows finite in half precision."""

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

# The parity tests, their torch reference and the benchmarks read these names here (ATTENTION_CALL_COST too).
from .layers import RMSNorm, SwiGLU, apply_rotary, apply_rotary_qk, classification_loss, layer_head_masks  # noqa: F401
from .layers import add_linear, pool, rotary_cos_sin, swiglu_hidden_size  # noqa: F401
from .unpadding import ATTENTION_CALL_COST, TracedRows, UnpaddedRows, masking_inputs, padded_mask  # noqa: F401
from .unpadding import positions_from_segment_ids, segment_ids_from_cu_seqlens  # noqa: F401
from .unpadding import tracing as _tracing


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
        classifier_pooling: str = "cls",
        tie_word_embeddings: bool = False,
        attention_bias: bool = False,
        mlp_bias: bool = False,
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
        if classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling={classifier_pooling!r}; expected 'cls' or 'mean'")
        # What the sequence-classification head reads: the first token (NeoBERT's head) or the mean over the
        # real tokens (ModernBERT's classifier_pooling='mean').
        self.classifier_pooling = classifier_pooling
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        self.unpad_inputs = unpad_inputs


class EncoderBlock(GradientCheckpointingLayer):
    """One pre-norm block. A GradientCheckpointingLayer: ``gradient_checkpointing_enable()`` (4.x) and
    ``activation_checkpointing_enable()`` (5.x) make it recompute itself in the backward pass."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.dim_head
        dim = config.hidden_size
        self.attention_norm = RMSNorm(dim, config.norm_eps)
        bias = getattr(config, "attention_bias", False)
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)  # rows grouped per head: [q_h | k_h | v_h]
        self.wo = nn.Linear(dim, dim, bias=bias)
        self.ffn_norm = RMSNorm(dim, config.norm_eps)
        self.ffn = SwiGLU(dim, swiglu_hidden_size(config.intermediate_size), bias=getattr(config, "mlp_bias", False))

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
        """x: [B, T, D] padded rows (with ``mask``), or [tokens, D] with ``rows``. ``eager`` returns the softmax
        weights; else scaled_dot_product_attention, and None for them."""
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
        x = add_linear(x, self.wo, attn)
        x = self.ffn(self.ffn_norm(x), residual=x)
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

    def _output(self, output, return_dict: Optional[bool]):
        """``output``, or its tuple where ``return_dict`` (the config's when None; 4.x's use_return_dict is False
        under torchscript) is False."""
        if return_dict is None:
            return_dict = getattr(self.config, "use_return_dict", getattr(self.config, "return_dict", True))
        return output if return_dict else output.to_tuple()

    # The token embedding is the encoder's (NeoBERTModel.encoder), in the heads under self.model (base_model).
    def get_input_embeddings(self) -> nn.Embedding:
        return self.base_model.encoder

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.base_model.encoder = value


class NeoBERTModel(NeoBERTPreTrainedModel):
    """The encoder: returns ``last_hidden_state`` [B, T, D] after the final RMSNorm (zeros at padded positions)."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.encoder = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.transformer_encoder = nn.ModuleList(EncoderBlock(config) for _ in range(config.num_hidden_layers))
        self.layer_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.post_init()

    def _unpadded_rows(
        self, real: Optional[torch.Tensor], segment_ids: Optional[torch.Tensor], eager: bool
    ) -> Optional[UnpaddedRows]:
        """The unpadded layout (inputs as from unpadding.masking_inputs) when it pays and may run: packed rows, or a batch with
        padding (traced: TracedRows), unless the attention must be the eager softmax. None: the padded computation."""
        if eager or not getattr(self.config, "unpad_inputs", True):
            return None
        if _tracing():
            return TracedRows(real) if real is not None and segment_ids is None else None
        if segment_ids is not None:
            return UnpaddedRows(segment_ids != 0, documents=segment_ids)
        return None if real is None else UnpaddedRows(real)

    def _encode(
        self,
        input_ids: Optional[torch.Tensor],
        attention_mask: Optional[torch.Tensor],
        position_ids: Optional[torch.Tensor],
        segment_ids: Optional[torch.Tensor],
        cu_seqlens: Optional[torch.Tensor],
        inputs_embeds: Optional[torch.Tensor],
        head_mask: Optional[torch.Tensor],
        output_hidden_states: Optional[bool],
        output_attentions: Optional[bool],
    ):
        """(final hidden states, padded or [tokens, D] when unpadded; ``place``, which pads such a tensor with zeros;
        the output fields hidden_states and attentions, None unless asked for: the config's flags where None). Every
        path returns the same tensors."""
        if output_hidden_states is None:
            output_hidden_states = getattr(self.config, "output_hidden_states", False)
        if output_attentions is None:
            output_attentions = getattr(self.config, "output_attentions", False)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        x = self.encoder(input_ids) if input_ids is not None else inputs_embeds
        batch, length = x.shape[:2]
        real, segment_ids = masking_inputs(batch, length, x.device, attention_mask, segment_ids, cu_seqlens)
        head_masks = layer_head_masks(head_mask, self.config.num_hidden_layers, self.config.num_attention_heads)
        eager = output_attentions or head_mask is not None or getattr(self.config, "_attn_implementation", None) == "eager"
        rows, mask, valid = self._unpadded_rows(real, segment_ids, eager), None, None
        if rows is None:
            mask = padded_mask(real, segment_ids)
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
        outputs = {"hidden_states": hidden_states, "attentions": attentions}
        return x, place, {name: None if value is None else tuple(value) for name, value in outputs.items()}

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
        x, place, outputs = self._encode(
            input_ids, attention_mask, position_ids, segment_ids, cu_seqlens, inputs_embeds, head_mask,
            output_hidden_states, output_attentions,
        )
        return self._output(BaseModelOutput(last_hidden_state=place(x), **outputs), return_dict)


class NeoBERTHeadModel(NeoBERTPreTrainedModel):
    """The encoder (``self.model``) with a task head: the heads' common forward, which encodes and asks ``head`` for
    the logits and the loss of the head's ``output_class``."""

    output_class = MaskedLMOutput
    packed_rows = True  # whether the head reads packed rows (segment_ids, cu_seqlens)

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.model = NeoBERTModel(config)

    def head(
        self, x: torch.Tensor, place, attention_mask: Optional[torch.Tensor], labels: Optional[torch.Tensor]
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(logits, loss or None) from the encoder's output as ``_encode`` returns it: x padded, or [tokens, D] with
        ``place`` to pad it."""
        raise NotImplementedError

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
    ) -> Union[MaskedLMOutput, SequenceClassifierOutput, Tuple]:
        """labels: the head's targets (its ``head``); max_seqlen and other keywords are accepted and ignored."""
        if not self.packed_rows and (segment_ids is not None or cu_seqlens is not None):
            raise ValueError("sequence classification pools the first token of each row: pass unpacked rows")
        x, place, outputs = self.model._encode(
            input_ids, attention_mask, position_ids, segment_ids, cu_seqlens, inputs_embeds, head_mask,
            output_hidden_states, output_attentions,
        )
        logits, loss = self.head(x, place, attention_mask, labels)
        return self._output(self.output_class(loss=loss, logits=logits, **outputs), return_dict)


class NeoBERTLMHead(NeoBERTHeadModel):
    """NeoBERT with its masked-language-model decoder (a Linear with bias; its weight is the token embedding's when
    ``config.tie_word_embeddings``, else its own as in the released model)."""

    # Tied only when config.tie_word_embeddings. 5.x reads {tied: source}; 4.x iterates it for the tied names.
    _tied_weights_keys = {"decoder.weight": "model.encoder.weight"}

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.decoder = value

    def head(self, x, place, attention_mask, labels):
        """labels [B, T]: target token id where the loss is taken, -100 elsewhere."""
        logits = place(self.decoder(x))  # the decoder runs on the real tokens only when the batch was unpadded
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.shape[-1]).float(), labels.to(logits.device).view(-1), ignore_index=-100
            )
        return logits, loss


class NeoBERTForSequenceClassification(NeoBERTHeadModel):
    """hidden[:, 0] (or the mean over real tokens, config.classifier_pooling) -> dropout -> dense (tanh) -> dropout
    -> classifier."""

    output_class = SequenceClassifierOutput
    packed_rows = False  # it pools each row's first token

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.dense._neobert_classifier = True
        self.classifier._neobert_classifier = True
        self.post_init()

    def head(self, x, place, attention_mask, labels):
        """labels: as transformers' sequence classification heads take them (classification_loss)."""
        pooled = self.dropout(pool(place(x), attention_mask, self.config.classifier_pooling))
        logits = self.classifier(self.dropout(torch.tanh(self.dense(pooled))))
        loss = None
        if labels is not None:
            loss, self.config.problem_type = classification_loss(logits, labels, self.config.problem_type)
        return logits, loss
