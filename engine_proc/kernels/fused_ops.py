"""The eager step's elementwise ops, fused in C++ on the CPU (csrc/elementwise.cpp), torch elsewhere.

Prefill and mixed steps run eagerly; there RMSNorm, RoPE and SiLU * up were several torch ops each,
with a pass over memory and a bfloat16 rounding between them (about a quarter of a 512-token
prefill). Here each is one pass, float32 inside, rounded once, as Inductor does in the compiled
decode steps, which keep their own fused loops: under torch.compile, on a GPU, in float16, or
without the built kernels, these are the plain torch ops.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine_proc.kernels import extension

_DTYPES = (torch.float32, torch.bfloat16)


def _fused(x: torch.Tensor) -> bool:
    return (not torch.compiler.is_compiling() and x.device.type == "cpu" and x.dtype in _DTYPES
            and extension.loaded())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fused(x) and weight.dtype == x.dtype and x.stride(-1) == 1:
        return torch.ops.rill_cpu.rms_norm(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x): the residual stream's next value and its norm, in one
    pass where fused (the same bits as the add, then the norm)."""
    if (_fused(x) and weight.dtype == x.dtype and residual.dtype == x.dtype and x.stride(-1) == 1
            and residual.stride(-1) == 1):
        total, normed = torch.ops.rill_cpu.add_rms_norm(x, residual, weight, eps)
        return normed, total
    total = residual + x
    return rms_norm(total, weight, eps), total


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the Hugging Face layout) on [T, heads, D] with cos/sin [T, 1, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_heads(x: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first num_heads heads of x [T, heads, D] rotated: in place in x where fused (x must be
    a fresh tensor the caller owns), else a new tensor."""
    if _fused(x) and x.stride(-1) == 1 and cos.dtype == x.dtype:
        torch.ops.rill_cpu.rope_(x, cos, sin, num_heads)
        return x[:, :num_heads]
    return apply_rope(x[:, :num_heads], cos, sin)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, where the last dimension holds gate then up."""
    if _fused(gate_up) and gate_up.dim() == 2 and gate_up.stride(-1) == 1:
        return torch.ops.rill_cpu.silu_mul(gate_up)
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return F.silu(gate) * up
