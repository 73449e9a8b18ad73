"""``model.py``'s layers (RMSNorm, rotary embedding, SwiGLU) and the helpers its classes share. Shipped beside it in
every export (imported relatively); imports nothing but ``torch``."""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .unpadding import tracing


def swiglu_hidden_size(intermediate_size: int, multiple_of: int = 8) -> int:
    """Width of the SwiGLU hidden layer: two thirds of ``intermediate_size``, rounded up to ``multiple_of``."""
    two_thirds = int(2 * intermediate_size / 3)
    return multiple_of * ((two_thirds + multiple_of - 1) // multiple_of)


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
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x [B, T, H, Dh] as complex numbers by pair i's angle, in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    cos = cos.unsqueeze(-2)  # broadcast over heads
    sin = sin.unsqueeze(-2)
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def apply_rotary_qk(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary on qk [tokens, H, 2, Dh] as one complex multiplication (complex numbers cannot be traced to
    ONNX, so the traceable path keeps apply_rotary)."""
    if tracing():
        return apply_rotary(qk, cos[:, None], sin[:, None])
    pairs = torch.view_as_complex(qk.float().unflatten(-1, (-1, 2)))
    turns = torch.complex(cos, sin)[:, None, None, :]  # broadcast over heads and over q / k
    return torch.view_as_real(pairs * turns).flatten(-2).to(qk.dtype)


def add_linear(x: torch.Tensor, linear: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """x + linear(h). In eager inference on the [tokens, D] matrix, one GEMM that accumulates into a copy of x
    (addmm), so the residual add costs no pass of its own."""
    if linear.bias is None and x.dim() == 2 and h.dim() == 2 and not torch.is_grad_enabled() and not tracing():
        return torch.addmm(x, h, linear.weight.t())
    return x + linear(h)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden, bias=bias)  # rows [0, hidden) are the gate
        self.w3 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """w3(silu(gate) * up), plus ``residual`` when given (add_linear)."""
        gate, up = self.w12(x).chunk(2, dim=-1)
        if torch.is_grad_enabled() or tracing():
            h = F.silu(gate) * up
        else:
            # Eager inference: the activation overwrites the gate's half of w12's output, so no new [tokens, hidden]
            # buffer is allocated and filled. (Autograd needs both halves kept; a traced graph would turn the
            # in-place write into a scatter into the whole output.)
            h = F.silu(gate, inplace=True).mul_(up)
        return self.w3(h) if residual is None else add_linear(residual, self.w3, h)


def layer_head_masks(head_mask: Optional[torch.Tensor], layers: int, heads: int) -> List[Optional[torch.Tensor]]:
    """Per layer, ``head_mask`` ([heads] for every layer, or [layers, heads]; 1 keeps a head, 0 silences it) as
    [1, heads, 1, 1], or Nones."""
    if head_mask is None:
        return [None] * layers
    if head_mask.dim() == 1:
        head_mask = head_mask[None].expand(layers, -1)
    if tuple(head_mask.shape) != (layers, heads):
        raise ValueError(
            f"head_mask must have shape ({heads},) or ({layers}, {heads}) (layers, heads), got {tuple(head_mask.shape)}"
        )
    return [m.view(1, heads, 1, 1) for m in head_mask]


def classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, problem_type: Optional[str]
) -> Tuple[torch.Tensor, str]:
    """(the sequence classification loss, the problem type), the type inferred as transformers does when None:
    regression for one label, single-label for integer labels, multi-label otherwise."""
    labels = labels.to(logits.device)
    num_labels = logits.shape[-1]
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        return F.mse_loss(logits.squeeze(-1).float(), labels.squeeze(-1).float()), problem_type
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels).float(), labels.view(-1)), problem_type
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float()), problem_type


def pool(hidden: torch.Tensor, attention_mask: Optional[torch.Tensor], pooling: str) -> torch.Tensor:
    """[B, T, D] -> [B, D]: the first token ("cls"), or the mean over the real tokens ("mean"), summed in float32
    as the JAX head pools (neobert_jax/model/encoder.py's pool)."""
    if pooling != "mean":
        return hidden[:, 0]
    real = torch.ones(hidden.shape[:2], device=hidden.device) if attention_mask is None else attention_mask
    real = real.float().unsqueeze(-1)
    return ((hidden.float() * real).sum(1) / real.sum(1).clamp(min=1.0)).to(hidden.dtype)
