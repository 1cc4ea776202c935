"""Batch-invariant attention over the paged cache: a token's result does not depend on the step.

The default path (engine_proc/attention/kv_cache.py) pads decode contexts to the batch's longest and lets
SDPA pick its blocking from the shapes, so a request's logits move in the last bits with what else
is in the step (measured: up to 4e-5 on the bundled model) and a near-tie can flip a greedy token.
Here every query, decode or prefill, attends over its sequence's cache gathered to a context
padded to a multiple of `PAD_MULTIPLE` and masked past its own position, with plain matmul and
softmax. Masked keys contribute exact zeros, and with the padding fixed to whole vector widths
the real keys keep their places in every reduction, so a row's arithmetic is the same alone, in
any batch, at any chunking of its prompt. A prompt token is computed as a decode row of its own
(its query heads against its padded context, one matmul each), so a recompute after preemption
repeats the decode's arithmetic too. Operands are contiguous: on strided ones matmul's path
depends on the batch size. bench/kernels/engine_step.py measures what this costs.
"""
from __future__ import annotations

import torch

from rill.engine_proc.attention.kv_cache import AttentionMetadata, gather_blocks

PAD_MULTIPLE = 64  # tokens; a multiple of every SIMD width and of the usual block sizes


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
        # Each prompt token is computed as a decode token would be: its query heads against its
        # own padded context, so a recompute after preemption repeats the decode's arithmetic.
        table = chunk.block_table.unsqueeze(0)
        k = gather_blocks(k_cache, table)[0].transpose(0, 1).contiguous()  # [H_kv, L, D]
        v = gather_blocks(v_cache, table)[0].transpose(0, 1).contiguous()
        for row, token in enumerate(range(chunk.token_start, chunk.token_end)):
            context_len = _round_up(chunk.start_pos + row + 1, PAD_MULTIPLE)
            o = _masked_attention(
                q[token].view(1, num_kv_heads, group, head_dim),
                k[:, :context_len].unsqueeze(0),
                v[:, :context_len].unsqueeze(0),
                chunk.causal_mask[row, :context_len].view(1, 1, 1, context_len),
                scale,
            )
            out[token] = o.view(num_heads, head_dim)
    return out


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v)
