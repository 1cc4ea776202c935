"""Paged decode attention on the CPU: a small C++ kernel (csrc/paged_decode.cpp), built for this CPU.

The torch path gathers each row's K/V blocks into a contiguous copy, then runs SDPA with a mask
over the longest context in the step: at batch 32 that is about two thirds of a millisecond per
layer, at batch 1 a hundred and fifty microseconds of small-op overhead. The kernel reads the
blocks where they lie, one (sequence, KV head) per OpenMP task, and also writes the step's new
K/V, so a decode step's attention is one call per layer.

It is built at first use for this CPU (engine_proc/cpu_kernels.py). No compiler, a failed build or
`RILL_CPU_KERNELS=0`: `paged_decode` returns None and callers take the torch path, which gives the
same results within rounding.
"""
from __future__ import annotations

import functools

import torch

from engine_proc import cpu_kernels

DTYPES = (torch.float32, torch.bfloat16)


def available() -> bool:
    return cpu_kernels.available()


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Attention of one query token per row, q [B, H, D], over keys 0..context_lens[b]-1 of row b,
    whose blocks are block_table[b] ([B, width] int64) in k_cache/v_cache [blocks, block_size,
    H_kv, D]. With k_new/v_new [B, H_kv, D] and slot_mapping [B] it first writes them into the
    cache. None when the kernel cannot take these tensors (the caller takes the torch path)."""
    if (q.dtype not in DTYPES or q.device.type != "cpu" or k_cache.dtype != q.dtype
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.stride(-1) != 1
            or q.shape[1] % k_cache.shape[2] or not cpu_kernels.available()):
        return None
    if k_new is not None and (k_new.stride(-1) != 1 or v_new.stride(-1) != 1 or k_new.dtype != q.dtype):
        return None
    return torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, block_table, context_lens, k_new, v_new, slot_mapping)


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """Causal attention of a prompt chunk q [Tq, H, D] over its keys k, v [Tk, H_kv, D] (the
    chunk's tokens are the last Tq keys), through oneDNN's micro-kernels (csrc/prefill_attention.cpp):
    on a 512-token prompt about a fifth faster than torch's flash attention with AMX, 5x with AVX-512
    BF16 alone (Zen 4). None where it does not apply (neither AMX-BF16 nor AVX-512 BF16, not
    bfloat16, a head dimension not a multiple of 64, under torch.compile): the caller runs SDPA."""
    if (q.dtype != torch.bfloat16 or q.device.type != "cpu" or q.shape[-1] % 64 or k.dtype != q.dtype
            or q.shape[1] % k.shape[1] or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1
            or torch.compiler.is_compiling() or not prefill_supported()):
        return None
    return torch.ops.rill_cpu.prefill_attention(q, k, v)


def prefill_supported() -> bool:
    # Asked only once the kernels are loaded: a call before must not fix the answer at False.
    return cpu_kernels.loaded() and _prefill_kernel_supported()


@functools.cache
def _prefill_kernel_supported() -> bool:
    return bool(torch.ops.rill_cpu.prefill_attention_supported())
