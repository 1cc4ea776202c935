"""Paged-attention steps for the kernel tests: caches scattered over shuffled blocks, and the
attention each token should get, computed one token at a time in float64."""
from __future__ import annotations

import torch

from rill.engine_proc.attention.kv_cache import write_kv


def build_step(step, block_size, num_heads, num_kv_heads, head_dim, dtype, gen, garbage):
    """Caches holding every sequence's K/V (the step's new K/V written, as before attention),
    scattered over shuffled blocks, with `garbage` in every slot no sequence owns."""
    blocks_per_seq = [-(-(cached + new) // block_size) for cached, new in step]
    num_blocks = sum(blocks_per_seq) + 3
    block_ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for n in blocks_per_seq:
        tables.append(block_ids[:n])
        block_ids = block_ids[n:]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, garbage, dtype=dtype)
    v_cache = torch.full(shape, garbage, dtype=dtype)
    seq_of_token, context_lens, new_slots = [], [], []
    for seq, ((cached, new), table) in enumerate(zip(step, tables)):
        positions = torch.arange(cached + new)
        slots = torch.tensor(table)[positions // block_size] * block_size + positions % block_size
        k = torch.randn(cached + new, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(cached + new, num_kv_heads, head_dim, generator=gen).to(dtype)
        write_kv(k_cache, v_cache, k, v, slots)
        seq_of_token += [seq] * new
        context_lens += list(range(cached + 1, cached + new + 1))
        new_slots.append(slots[cached:])
    # Rows padded with a block id past the cache: reading one would fail or poison the output.
    max_blocks = max(blocks_per_seq) + 1
    block_tables = torch.tensor([t + [num_blocks + 7] * (max_blocks - len(t)) for t in tables])
    q = torch.randn(len(seq_of_token), num_heads, head_dim, generator=gen).to(dtype)
    return dict(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
        seq_of_token=torch.tensor(seq_of_token), context_lens=torch.tensor(context_lens),
        tables=tables, slot_mapping=torch.cat(new_slots),
    )


def per_token_reference(s, scale) -> torch.Tensor:
    """Softmax attention of each token over its context, one token at a time, in float64."""
    q, k_cache, v_cache = s["q"], s["k_cache"], s["v_cache"]
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    group = q.shape[1] // num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    seqs_and_lens = zip(s["seq_of_token"].tolist(), s["context_lens"].tolist())
    for t, (seq, context_len) in enumerate(seqs_and_lens):
        positions = torch.arange(context_len)
        table = torch.tensor(s["tables"][seq])
        slots = table[positions // block_size] * block_size + positions % block_size
        k = k_cache.view(-1, num_kv_heads, head_dim)[slots].double().repeat_interleave(group, dim=1)
        v = v_cache.view(-1, num_kv_heads, head_dim)[slots].double().repeat_interleave(group, dim=1)
        weights = (torch.einsum("hd,chd->hc", q[t].double(), k) * scale).softmax(dim=-1)
        out[t] = torch.einsum("hc,chd->hd", weights, v)
    return out
