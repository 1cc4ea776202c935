"""The GPU's decode attention in two Triton kernels a layer: the step's K/V into the paged cache, then
one query row per program group against its sequence's cached context.

The general kernel (triton.py) serves every token of a step, prompts too, through per-token tiles it
works out with a dozen small scans; a decode step has one row per sequence, so these two need none
of that: a compiled decode step (CUDA graphs) runs 2 kernels a layer for attention instead of about
25. The write is a kernel of its own, not the attention's first act, because a speculative step's
draft rows of one sequence read each other's K/V: every row's write must land before any row reads.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_BLOCK_N = 64  # keys per inner step: a decode reads few enough that fewer, longer steps hide latency


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch, stride_vcb, stride_vcs, stride_vch, block_size,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + row * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(v_ptr + row * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    k_dst = k_cache_ptr + block * stride_cb + offset * stride_cs + heads[:, None] * stride_ch + dims[None, :]
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads[:, None] * stride_vch + dims[None, :]
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """kv_cache.write_kv in one kernel: each row's K and V [T, H_kv, D] at its slot, every head at once."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), k_cache.shape[1],
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
    )


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, context_lens_ptr,
    scale_log2e,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_table, block_size,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Program (row, h): the GROUP query heads of KV head h of one decode row (padded to GROUP_PAD,
    # the smallest tile tl.dot takes), against keys [0, context_len) of the row's blocks.
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    heads = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    head_valid = heads < GROUP
    dim_valid = dims < HEAD_DIM
    q_mask = head_valid[:, None] & dim_valid[None, :]
    q_heads = kv_head * GROUP + heads
    q = tl.load(q_ptr + row * stride_qt + q_heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(k_cache_ptr.dtype.element_ty)
    context_len = tl.load(context_lens_ptr + row)
    table_row = block_tables_ptr + row.to(tl.int64) * stride_table

    # Online softmax in base 2, in fp32, from a finite running max (as in triton.py).
    m_i = tl.full([GROUP_PAD], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    for key_start in range(0, context_len, BLOCK_N):
        key_pos = key_start + tl.arange(0, BLOCK_N)
        key_valid = key_pos < context_len
        block_ids = tl.load(table_row + key_pos // block_size, mask=key_valid, other=0).to(tl.int64)
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        k_slots = block_ids * stride_kb + (key_pos % block_size) * stride_ks + kv_head * stride_kh
        k = tl.load(k_cache_ptr + k_slots[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v_slots = block_ids * stride_vb + (key_pos % block_size) * stride_vs + kv_head * stride_vh
        v = tl.load(v_cache_ptr + v_slots[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
        scores = tl.where(key_valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_i[:, None]
    tl.store(out_ptr + row * stride_ot + q_heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row per sequence, q [B, H, D], against keys [0, context_lens[b]) of the blocks in row b
    of block_tables [B, num_blocks] (the step's K/V already written): out [B, H, D]."""
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and num_heads % num_kv_heads == 0
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty_like(q)
    if num_rows == 0:
        return out
    group = num_heads // num_kv_heads
    _decode_attention_kernel[(num_rows, num_kv_heads)](
        q, k_cache, v_cache, out, block_tables, context_lens,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), k_cache.shape[1],
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_N=_BLOCK_N, DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
    )
    return out
