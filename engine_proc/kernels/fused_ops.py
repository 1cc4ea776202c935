"""The eager step's elementwise ops, fused in C++ on the CPU (csrc/elementwise.cpp), with their torch twin.

Prefill and mixed steps run eagerly; there RMSNorm, RoPE and SiLU * up were several torch ops each,
with a pass over memory and a bfloat16 rounding between them (about a quarter of a 512-token
prefill). CpuOps runs each as one pass, float32 inside, rounded once, as Inductor does in the
compiled decode steps, which keep their own fused loops (under torch.compile CpuOps gives the torch
ops). TorchOps serves a GPU, float16 and a CPU without the built kernels. Which one a model takes
is chosen once, after loading (elementwise_ops, called by LlamaForCausalLM.bind_kernels).
"""
from __future__ import annotations

import torch

from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.torch_ops import TorchOps

_DTYPES = (torch.float32, torch.bfloat16)


class CpuOps(TorchOps):
    """The C++ operators, for float32 or bfloat16 CPU tensors with contiguous rows in the weights'
    dtype (as the model's are), each the bits of its twin's ops within one rounding; while
    torch.compile traces (a compiled decode step), the twin's, which Inductor fuses itself."""

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return TorchOps.rms_norm(x, weight, eps)
        return torch.ops.rill_cpu.rms_norm(x, weight, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """In one pass: the same bits as the add, then the norm."""
        if torch.compiler.is_compiling():
            return TorchOps.add_rms_norm(x, residual, weight, eps)
        total, normed = torch.ops.rill_cpu.add_rms_norm(x, residual, weight, eps)
        return normed, total

    @staticmethod
    def rope_heads(x: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """In place in x (which must be a fresh tensor the caller owns); returns its rotated heads."""
        if torch.compiler.is_compiling():
            return TorchOps.rope_heads(x, num_heads, cos, sin)
        torch.ops.rill_cpu.rope_(x, cos, sin, num_heads)
        return x[:, :num_heads]

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2n] -> [T, n]."""
        if torch.compiler.is_compiling():
            return TorchOps.silu_mul(gate_up)
        return torch.ops.rill_cpu.silu_mul(gate_up)


def elementwise_ops(weight: torch.Tensor) -> type[TorchOps]:
    """CpuOps for a model whose weights are like `weight` (float32 or bfloat16 on the CPU) once the
    kernels are loaded, TritonOps (triton_ops.py) on a GPU, else TorchOps. Asks loaded(), not available(): a model that nothing else
    built the kernels for (the torch backend in float32) keeps the plain torch ops it had."""
    if weight.device.type == "cpu" and weight.dtype in _DTYPES and extension.loaded():
        return CpuOps
    if weight.device.type == "cuda":
        try:
            from rill.engine_proc.kernels.triton_ops import TritonOps, works_on
        except ImportError:  # no Triton: torch's ops
            return TorchOps
        return TritonOps if works_on(weight.device, weight.dtype) else TorchOps
    return TorchOps
