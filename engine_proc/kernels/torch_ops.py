"""The elementwise ops in plain torch: the twin every fused op (fused_ops.py's C++, triton_ops.py's Triton) is
checked against, and what a model runs where neither serves."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the Hugging Face layout) on [T, heads, D] with cos/sin [T, 1, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class TorchOps:
    """The plain torch ops: the twin every fused op is checked against."""

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(residual + x), residual + x): the residual stream's next value and its norm."""
        total = residual + x
        return F.rms_norm(total, (total.shape[-1],), weight, eps), total

    @staticmethod
    def rope_heads(x: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The first num_heads heads of x [T, heads, D] rotated, as a new tensor."""
        return apply_rope(x[:, :num_heads], cos, sin)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up, where the last dimension holds gate then up."""
        gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
        return F.silu(gate) * up
