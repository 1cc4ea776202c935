"""Paged attention in Triton for the GPU: one kernel for every token of a step, decode and prefill."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# Query rows per program: tokens of one sequence times the query heads of one KV head.
# 16 is the smallest tile tl.dot takes; a tuned value (64 for long prefills) is GPU work.
_BLOCK_M = 16
_BLOCK_N = 32  # keys per inner step, read through the block table one slot at a time


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, seq_of_token_ptr, context_lens_ptr, tile_lens_ptr,
    scale_log2e,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_table, block_size,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Program (t, h) leads the tile of tile_len consecutive tokens of one sequence that
    # starts at token t (tile_len 0: another program covers token t) for KV head h.
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile_len = tl.load(tile_lens_ptr + token)
    if tile_len > 0:
        rows = tl.arange(0, BLOCK_M)
        row_token = token + rows // GROUP_PAD
        row_head = kv_head * GROUP + rows % GROUP_PAD
        row_valid = (rows // GROUP_PAD < tile_len) & (rows % GROUP_PAD < GROUP)
        dims = tl.arange(0, HEAD_DIM_PAD)
        dim_valid = dims < HEAD_DIM

        q_offsets = row_token[:, None] * stride_qt + row_head[:, None] * stride_qh + dims[None, :]
        q_mask = row_valid[:, None] & dim_valid[None, :]
        q = tl.load(q_ptr + q_offsets, mask=q_mask, other=0.0).to(k_cache_ptr.dtype.element_ty)
        row_context_len = tl.load(context_lens_ptr + row_token, mask=row_valid, other=0)
        tile_context_len = tl.max(row_context_len, axis=0)
        table_row = block_tables_ptr + tl.load(seq_of_token_ptr + token).to(tl.int64) * stride_table

        # Online softmax in base 2 (exp2 is the GPU's native exponential), all in fp32.
        # A finite start for the running max: a row masked in a whole key tile then gives
        # exp2(-inf - finite) = 0, never exp2(-inf + inf) = NaN.
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
        for key_start in range(0, tile_context_len, BLOCK_N):
            key_pos = key_start + tl.arange(0, BLOCK_N)
            key_valid = key_pos < tile_context_len
            block_ids = tl.load(table_row + key_pos // block_size, mask=key_valid, other=0)
            slots = block_ids.to(tl.int64) * stride_kb + (key_pos % block_size) * stride_ks
            kv_mask = key_valid[:, None] & dim_valid[None, :]
            k = tl.load(
                k_cache_ptr + slots[:, None] + kv_head * stride_kh + dims[None, :],
                mask=kv_mask, other=0.0,
            )
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
            attend = key_pos[None, :] < row_context_len[:, None]
            scores = tl.where(attend, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v_slots = block_ids.to(tl.int64) * stride_vb + (key_pos % block_size) * stride_vs
            v = tl.load(
                v_cache_ptr + v_slots[:, None] + kv_head * stride_vh + dims[None, :],
                mask=kv_mask, other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        l_i = tl.where(l_i > 0, l_i, 1.0)  # padding rows only: they are not stored
        out = acc / l_i[:, None]
        o_offsets = row_token[:, None] * stride_ot + row_head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + o_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def tile_lens_of(seq_of_token: torch.Tensor, tokens_per_tile: int) -> torch.Tensor:
    """Per token: how many tokens its program covers (0 unless it starts a tile).

    Tiles are runs of consecutive tokens of one sequence, at most tokens_per_tile long.
    Computed on the device with scans, so no host sync.
    """
    num_tokens = seq_of_token.shape[0]
    index = torch.arange(num_tokens, device=seq_of_token.device)
    is_start = torch.ones(num_tokens, dtype=torch.bool, device=seq_of_token.device)
    is_start[1:] = seq_of_token[1:] != seq_of_token[:-1]
    run_start = torch.where(is_start, index, 0).cummax(0).values
    is_end = torch.ones_like(is_start)
    is_end[:-1] = is_start[1:]
    run_end = torch.where(is_end, index + 1, num_tokens).flip(0).cummin(0).values.flip(0)
    leads = (index - run_start) % tokens_per_tile == 0
    return torch.where(leads, (run_end - index).clamp(max=tokens_per_tile), 0).to(torch.int32)


def tokens_per_tile(num_heads: int, num_kv_heads: int) -> int:
    """Tokens of one sequence a program covers: as many as fill its rows with their query heads."""
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    return max(_BLOCK_M, group_pad) // group_pad


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_of_token: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    tile_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each query token over its sequence's cached K/V: out [T, H, D].

    q [T, H, D]; caches [num_blocks, block_size, num_kv_heads, D], this step's K/V already
    written; token t attends to positions [0, context_lens[t]) of sequence seq_of_token[t],
    whose blocks are block_tables[seq_of_token[t]]. A prefill token at position p has
    context_len p + 1, which makes the same loop causal for prefill and plain for decode.
    `tile_lens`: tile_lens_of(seq_of_token, tokens_per_tile(H, H_kv)), when the step has it already.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    assert cache_head_dim == head_dim and num_heads % num_kv_heads == 0, (q.shape, k_cache.shape)
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and v_cache.shape == k_cache.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_m = max(_BLOCK_M, group_pad)
    if tile_lens is None:
        tile_lens = tile_lens_of(seq_of_token, block_m // group_pad)
    # fp32 caches: exact fp32 products, to match the CPU twin (the default would be TF32).
    dot_precision = "ieee" if k_cache.dtype == torch.float32 else "tf32"
    _paged_attention_kernel[(num_tokens, num_kv_heads)](
        q, k_cache, v_cache, out,
        block_tables, seq_of_token, context_lens, tile_lens,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), block_size,
        GROUP=group, GROUP_PAD=group_pad,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=block_m, BLOCK_N=_BLOCK_N, DOT_PRECISION=dot_precision,
    )
    return out
