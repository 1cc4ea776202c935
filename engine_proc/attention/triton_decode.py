"""The GPU's decode attention in Triton: the step's K/V into the paged cache, then one query row per
sequence against its cached context, its keys cut into runs that programs of their own read when the
step is too small to fill the GPU (flash decoding), and those runs' partial sums combined.

The general kernel (triton.py) serves every token of a step, prompts too, through per-token tiles it
works out with a dozen small scans; a decode step has one row per sequence, so these need none of
that: a compiled decode step (CUDA graphs) runs 2 or 3 kernels a layer for attention instead of
about 25. The write is a kernel of its own, not the attention's first act, because a speculative step's
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
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_acc_ptr, part_ml_ptr, block_tables_ptr, context_lens_ptr,
    scale_log2e,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_table, block_size, num_heads,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Program (row, h, split): the GROUP query heads of KV head h of one decode row (padded to
    # GROUP_PAD, the smallest tile tl.dot takes) against its split's share of keys [0, context_len):
    # whole key tiles, the context cut into SPLITS runs. One split writes the output; several write
    # their unnormalised sums and (max, sum of weights) for _combine_kernel (flash decoding: a short
    # batch of long contexts keeps the GPU's multiprocessors busy).
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    heads = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    head_valid = heads < GROUP
    dim_valid = dims < HEAD_DIM
    q_mask = head_valid[:, None] & dim_valid[None, :]
    q_heads = kv_head * GROUP + heads
    q = tl.load(q_ptr + row * stride_qt + q_heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(k_cache_ptr.dtype.element_ty)
    context_len = tl.load(context_lens_ptr + row)
    run_len = tl.cdiv(tl.cdiv(context_len, SPLITS), BLOCK_N) * BLOCK_N
    run_start = split * run_len
    run_end = tl.minimum(run_start + run_len, context_len)
    table_row = block_tables_ptr + row.to(tl.int64) * stride_table

    # Online softmax in base 2, in fp32, from a finite running max (as in triton.py).
    m_i = tl.full([GROUP_PAD], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    for key_start in range(run_start, run_end, BLOCK_N):
        key_pos = key_start + tl.arange(0, BLOCK_N)
        key_valid = key_pos < run_end
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

    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + row * stride_ot + q_heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:  # partials at [row, head, split]: acc [.., HEAD_DIM_PAD], then max and weight sum [.., 2]
        part = (row * num_heads + q_heads) * SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + dims[None, :], acc, mask=head_valid[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=head_valid)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=head_valid)


@triton.jit
def _combine_kernel(part_acc_ptr, part_ml_ptr, out_ptr, stride_ot, stride_oh, num_heads,
                    SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    # Program (row, head): its splits' partial sums rescaled to their common max and normalised.
    row = tl.program_id(0)
    head = tl.program_id(1)
    part = (row * num_heads + head) * SPLITS + tl.arange(0, SPLITS)
    dims = tl.arange(0, HEAD_DIM_PAD)
    m = tl.load(part_ml_ptr + part * 2)
    weight = tl.exp2(m - tl.max(m, axis=0))  # a split with no keys: m = -1e30, weight 0
    total = tl.sum(weight * tl.load(part_ml_ptr + part * 2 + 1), axis=0)
    acc = tl.sum(weight[:, None] * tl.load(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + dims[None, :]), axis=0)
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def num_splits(num_programs: int, num_sms: int, most: int = 16) -> int:
    """Key splits a row takes: the most (a power of two, up to `most`) that keeps the programs of a
    step within two waves of the GPU's multiprocessors."""
    splits = 1
    while splits < most and num_programs * splits * 2 <= 2 * num_sms:
        splits *= 2
    return splits


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                            splits: int | None = None) -> torch.Tensor:
    """One query row per sequence, q [B, H, D], against keys [0, context_lens[b]) of the blocks in row b
    of block_tables [B, num_blocks] (the step's K/V already written): out [B, H, D]. `splits`: how many
    runs each row's keys are cut into (default: num_splits for the step's size, fixed for a CUDA graph
    of that size)."""
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and num_heads % num_kv_heads == 0
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty_like(q)
    if num_rows == 0:
        return out
    group = num_heads // num_kv_heads
    splits = splits or num_splits(num_rows * num_kv_heads, _num_sms(q.device))
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    part_acc = part_ml = out  # unused with one split
    if splits > 1:
        part_acc = torch.empty(num_rows * num_heads * splits * head_dim_pad, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(num_rows * num_heads * splits * 2, dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(num_rows, num_kv_heads, splits)](
        q, k_cache, v_cache, out, part_acc, part_ml, block_tables, context_lens,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), k_cache.shape[1], num_heads,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_N=_BLOCK_N, SPLITS=splits, DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
    )
    if splits > 1:
        _combine_kernel[(num_rows, num_heads)](part_acc, part_ml, out, out.stride(0), out.stride(1), num_heads,
                                               SPLITS=splits, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad)
    return out
