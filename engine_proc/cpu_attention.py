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

import ctypes
import functools

import torch

from engine_proc import cpu_kernels

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The loaded kernel library, built first if needed; None where it cannot be had."""
    lib = cpu_kernels.load("paged_decode", "decode attention takes the slower torch path")
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.rill_paged_decode.argtypes = [ctypes.c_int, ptr, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, ptr,
                                      ptr, ptr, i64, ptr, i64, i64, i64, i64, i64, ctypes.c_float]
    lib.rill_paged_decode.restype = ctypes.c_int
    lib.rill_omp_max_threads.restype = ctypes.c_int
    return lib


def available() -> bool:
    return kernel() is not None


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
    lib = kernel()
    code = DTYPE_CODES.get(q.dtype)
    if (lib is None or code is None or q.device.type != "cpu" or k_cache.dtype != q.dtype
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.stride(-1) != 1):
        return None
    if k_new is not None and (k_new.stride(-1) != 1 or v_new.stride(-1) != 1 or k_new.dtype != q.dtype):
        return None
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    table = block_table.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype)
    writes = k_new is not None
    slots = slot_mapping.to(torch.int64).contiguous() if writes else None
    status = lib.rill_paged_decode(
        code, out.data_ptr(), q.data_ptr(), q.stride(0), q.stride(1),
        k_new.data_ptr() if writes else None, k_new.stride(0) if writes else 0, k_new.stride(1) if writes else 0,
        v_new.data_ptr() if writes else None, v_new.stride(0) if writes else 0, v_new.stride(1) if writes else 0,
        k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr() if writes else None, table.data_ptr(),
        table.stride(0), lens.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim, block_size,
        head_dim**-0.5)
    return out if status == 0 else None
