"""The prompt chunks' attention through AMX micro-kernels (csrc/prefill_attention.cpp) against SDPA.

It runs only where the CPU has AMX-BF16 (elsewhere these tests skip and prefill takes SDPA)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rill.engine_proc.attention import cpu as cpu_attention
from rill.engine_proc.attention.kv_cache import AttentionMetadata, PrefillChunk, paged_attention
from rill.engine_proc.kernels import extension


def supported() -> bool:
    return extension.available() and bool(torch.ops.rill_cpu.prefill_attention_supported())


pytestmark = pytest.mark.skipif(not supported(), reason="neither AMX-BF16 nor AVX-512 BF16 on this CPU (or no built kernels): SDPA serves")


def chunk(num_q: int, num_k: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0):
    """q, k, v as the model has them: views of one fused qkv [Tk, H + 2 H_kv, D], the queries the
    last num_q tokens."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_k, heads + 2 * kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    return q[num_k - num_q:], k, v


def sdpa(q, k, v, dtype):
    """Offset-causal SDPA in `dtype`: query i is key position Tk - Tq + i."""
    num_q, num_k = q.shape[0], k.shape[0]
    mask = torch.arange(num_k).unsqueeze(0) <= (torch.arange(num_q) + num_k - num_q).unsqueeze(1)
    o = F.scaled_dot_product_attention(*(t.to(dtype).transpose(0, 1).unsqueeze(0) for t in (q, k, v)),
                                       attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1)


@pytest.mark.parametrize(("num_q", "num_k"), [(512, 512), (37, 37), (100, 300), (1, 65), (64, 64), (130, 1000)])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 128), (8, 2, 64)])
def test_matches_sdpa_within_bfloat16_rounding(num_q, num_k, heads, kv_heads, head_dim):
    q, k, v = chunk(num_q, num_k, heads, kv_heads, head_dim)
    out = torch.ops.rill_cpu.prefill_attention(q, k, v)
    exact = sdpa(q, k, v, torch.float64)
    error = (out.double() - exact).abs().max().item()
    torch_error = (sdpa(q, k, v, torch.bfloat16).double() - exact).abs().max().item()
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert error <= max(2 * torch_error, 1e-2), (error, torch_error)


def test_a_query_sees_no_key_after_its_own():
    q, k, v = chunk(70, 70, 2, 1, 64)
    v2 = v.clone()
    v2[40:] = 1000.0  # keys after query 39 changed: queries 0..39 must not see it
    a = torch.ops.rill_cpu.prefill_attention(q, k, v)
    b = torch.ops.rill_cpu.prefill_attention(q, k, v2)
    assert torch.equal(a[:40], b[:40])
    assert not torch.equal(a[40:], b[40:])


def test_what_it_does_not_take_returns_none_or_a_clear_error():
    q, k, v = chunk(16, 16, 4, 2, 64)
    assert cpu_attention.prefill(q.float(), k.float(), v.float()) is None  # float32: SDPA
    q48, k48, v48 = chunk(16, 16, 4, 2, 48)
    assert cpu_attention.prefill(q48, k48, v48) is None
    with pytest.raises(RuntimeError, match="multiple of 64"):
        torch.ops.rill_cpu.prefill_attention(q48, k48, v48)


def test_paged_attention_takes_it_for_prompts_and_cached_prefixes():
    """A fresh prompt and a chunk on top of cached blocks go to the kernel and give SDPA's answer;
    a context padded past the chunk (its tokens not the last keys) goes to SDPA."""
    heads, kv_heads, head_dim, block_size, cached, new = 6, 2, 64, 16, 48, 40
    total = cached + new
    q, k, v = chunk(total, total, heads, kv_heads, head_dim, seed=3)
    k_cache = torch.zeros(8, block_size, kv_heads, head_dim, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    table = torch.tensor([5, 2, 7, 1, 3, 6, 4])
    for t in range(total):
        k_cache[table[t // block_size], t % block_size] = k[t]
        v_cache[table[t // block_size], t % block_size] = v[t]
    calls = []

    def prefill(*args):  # the kernel, counted
        calls.append(args[0].shape[0])
        return cpu_attention.prefill(*args)

    def run(context_len, start, with_table):
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long))
        ch = PrefillChunk(token_start=0, token_end=total - start, start_pos=start)
        if with_table:
            ch.block_table, ch.context_len = table, context_len
            ch.causal_mask = torch.arange(context_len).unsqueeze(0) <= torch.arange(start, total).unsqueeze(1)
        meta.prefills = [ch]
        meta.num_decode_tokens = 0
        return paged_attention(q[start:], k[start:], v[start:], k_cache, v_cache, meta, prefill=prefill)

    fresh = run(total, 0, False)
    on_cache = run(total, cached, True)
    assert calls == [total, new]
    assert (fresh.double() - sdpa(q, k, v, torch.float64)).abs().max() < 1e-2
    assert (on_cache.double() - sdpa(q[cached:], k, v, torch.float64)).abs().max() < 1e-2
    padded = run(total + block_size, cached, True)  # keys past the chunk's end, masked off
    assert calls == [total, new] and (padded - on_cache).abs().max() < 1e-2
