"""Batch-invariant attention over the paged cache: a token's result does not depend on the step.

The default path (engine_proc/kv_cache.py) pads decode contexts to the batch's longest and lets
SDPA pick its blocking from the shapes, so a request's logits move in the last bits with what else
is in the step (measured: up to 4e-5 on the bundled model) and a near-tie can flip a greedy token.
Here every query, decode or prefill, attends over its sequence's cache gathered to a context
padded to a multiple of `PAD_MULTIPLE` and masked past its own position, with plain matmul and
softmax. Masked keys contribute exact zeros, and with the padding fixed to whole vector widths
the real keys keep their places in every reduction, so a row's arithmetic is the same alone, in
any batch, at any chunking of its prompt. bench/engine_step.py measures what this costs.
"""
from __future__ import annotations

import torch

from engine_proc.kv_cache import AttentionMetadata, gather_blocks

PAD_MULTIPLE = 64  # tokens; a multiple of every SIMD width and of the usual block sizes
QUERY_TILE = 32  # prompt tokens computed at once, each as a decode row: bounds the K/V copies


def invariant_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> torch.Tensor:
    """Attention of the step's queries [T, H, D]; the step's K/V are already in the cache.

    Expects metadata built with `batch_invariant`: a decode block table covering
    `decode_context_len` (a multiple of PAD_MULTIPLE) with `decode_mask`, and every prefill chunk
    with a block table and a causal mask over its padded context.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = head_dim**-0.5
    out = torch.empty_like(q)
    num_decodes = meta.num_decode_tokens
    if num_decodes:
        # Contiguous [B, H_kv, L, D]: on strided operands matmul's path depends on B.
        k = gather_blocks(k_cache, meta.decode_block_table).transpose(1, 2).contiguous()
        v = gather_blocks(v_cache, meta.decode_block_table).transpose(1, 2).contiguous()
        q_decode = q[:num_decodes].view(num_decodes, num_kv_heads, group, head_dim)
        o = _masked_attention(q_decode, k, v, meta.decode_mask, scale)  # [B, H_kv, group, D]
        out[:num_decodes] = o.reshape(num_decodes, num_heads, head_dim)
    for chunk in meta.prefills:
        # Each prompt token is computed as a decode token would be (a batch row of its own with
        # the same shapes), so a recompute after preemption repeats the decode's arithmetic.
        table = chunk.block_table.unsqueeze(0)
        k = gather_blocks(k_cache, table)[0].transpose(0, 1)  # [H_kv, L, D]
        v = gather_blocks(v_cache, table)[0].transpose(0, 1)
        for start in range(chunk.token_start, chunk.token_end, QUERY_TILE):
            end = min(start + QUERY_TILE, chunk.token_end)
            rows = end - start
            q_rows = q[start:end].view(rows, num_kv_heads, group, head_dim)
            k_rows = k.expand(rows, *k.shape).contiguous()
            v_rows = v.expand(rows, *v.shape).contiguous()
            first = start - chunk.token_start
            mask = chunk.causal_mask[first : first + rows].view(rows, 1, 1, -1)
            o = _masked_attention(q_rows, k_rows, v_rows, mask, scale)
            out[start:end] = o.reshape(rows, num_heads, head_dim)
    return out


def _masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v)
