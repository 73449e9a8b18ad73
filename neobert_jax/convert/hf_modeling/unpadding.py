"""Unpadding for ``model.py``: where the real tokens of a padded or packed batch go, and attention per document on
them. Shipped beside it in every export (imported relatively); imports nothing but ``torch``."""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

def tracing() -> bool:
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
    """The real tokens of a padded or packed batch gathered into [tokens, D], one document after another (longest
    first), and cut into attention groups: consecutive documents share a call when padding them to the group's
    longest costs less than a call of their own (``call_cost``). ``groups``: (start, stop, length, slots or None,
    key mask or None). Built once per forward, so the blocks do no per-document Python work.
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


class TracedRows:
    """Unpadding a traced graph can hold (its shapes cannot depend on loops over the data): dense layers on the
    gathered real tokens, attention on the padded [B, T] layout with a key mask."""

    def __init__(self, real: torch.Tensor):
        self.batch, self.length = real.shape
        self.index = real.flatten().nonzero().squeeze(1)  # [tokens]: its size depends on the data
        self.mask = padded_mask(real, None)

    gather = UnpaddedRows.gather
    scatter = UnpaddedRows.scatter

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v [tokens, H, Dh] -> [tokens, H * Dh], attention within each row."""
        q, k, v = (self.scatter(t).transpose(1, 2) for t in (q, k, v))  # [B, H, T, Dh], zeros at padding
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=0.0)
        return self.gather(out.transpose(1, 2).flatten(2))


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


def masking_inputs(
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
        attention_mask = None if not tracing() and bool(real.all()) else real
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


def padded_mask(real: Optional[torch.Tensor], segment_ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The padded computation's boolean mask, broadcastable to [B, H, T, T] (True = attend), or None."""
    if segment_ids is not None:
        # A token sees only tokens of its own document. Padding (id 0) sees only padding, which keeps its
        # (ignored) outputs finite instead of NaN from an all-masked softmax row.
        return segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    if real is None:
        return None
    keys = real | ~real.any(dim=1, keepdim=True)  # a row without tokens attends to all: never all-masked
    if tracing():  # ONNX's Attention op (opset 23) in onnxruntime wants the query axis spelled out
        return keys[:, None, None, :].expand(-1, -1, keys.shape[1], -1)
    return keys[:, None, None, :]
