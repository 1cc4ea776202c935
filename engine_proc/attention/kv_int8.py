"""The int8 KV cache's rows (--kv-cache-dtype int8) in torch: quantize on write, dequantize on read.

A cached row (one token, one KV head) is head_dim int8 values followed by its float32 scale
(4 bytes, its amax / 127), so an int8 cache tensor is [num_blocks, block_size, H_kv, head_dim + 4]
int8 and a block carries its own scales (a block read or written whole, as the disk tier of the
prefix cache does, needs nothing else). A scale per (token, head), not per block: a decode step
writes one token of a block at a time, and a block-wide scale would have to be re-derived and the
block re-quantized whenever a larger value arrived; with a row's own scale a write touches that row
alone, and the kernels apply it once per row (to a score, or to a probability), not per value.
llama.cpp's q8_0 uses a scale per 32 values; a row here is 64 (the bundled model): 6% of the bytes.

This is the torch twin of csrc/kv_int8.cpp, bit for bit on writes (same division, same rounding):
the reference the C++ decode kernel and gather are checked against, and the portable path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SCALE_BYTES = 4  # the float32 scale at the end of each row
KV_CACHE_DTYPES = ("auto", "int8")


def row_bytes(head_dim: int) -> int:
    return head_dim + SCALE_BYTES


def head_dim_of_cache(cache: torch.Tensor) -> int:
    return cache.shape[-1] - SCALE_BYTES if cache.dtype == torch.int8 else cache.shape[-1]


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., D] float rows as [..., D + 4] int8: round(x / scale) in [-127, 127], then the scale's bytes."""
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True) / 127
    q = torch.round(xf / torch.where(scale > 0, scale, 1.0)).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 4] int8 rows back as [..., D] in `dtype` (value * scale, in float32 first)."""
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    return (rows[..., :-SCALE_BYTES].float() * scale).to(dtype)


def write_kv_int8(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """The step's K/V [T, H_kv, D], quantized, into their slots of int8 caches (kv_cache.write_kv's twin)."""
    num_kv_heads, width = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, width).index_copy_(0, slot_mapping, quantize_rows(k))
    v_cache.view(-1, num_kv_heads, width).index_copy_(0, slot_mapping, quantize_rows(v))


def gather_dequant(cache: torch.Tensor, block_table: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """The first `length` keys (or values) of the blocks `block_table` [num_blocks], as [length, H_kv, D]."""
    rows = cache.index_select(0, block_table.reshape(-1).long()).flatten(0, 1)[:length]
    return dequantize_rows(rows, dtype)


def decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     context_lens: torch.Tensor) -> torch.Tensor:
    """One query token per row q [B, H, D] over its dequantized keys, in float32 SDPA row by row: what the
    C++ decode kernel over an int8 cache must match (engine_proc/attention/cpu.py's paged_decode)."""
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        length = int(context_lens[b])
        k = gather_dequant(k_cache, block_table[b], length, torch.float32).transpose(0, 1)
        v = gather_dequant(v_cache, block_table[b], length, torch.float32).transpose(0, 1)
        o = F.scaled_dot_product_attention(q[b].float().unsqueeze(1), k, v, enable_gqa=True)
        out[b] = o.squeeze(1).to(q.dtype)
    return out
