"""--kv-cache-dtype int8: the rows' round trip, the C++ writes, decode and gather against the torch twin
(engine_proc/attention/kv_int8.py) and against float attention, and a model's greedy text against bfloat16's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rill.engine_proc.attention import cpu as cpu_attention
from rill.engine_proc.attention import kv_int8
from rill.engine_proc.attention.kv_cache import KVCache
from rill.engine_proc.attention.kv_layout import bytes_per_block, num_blocks_for_memory
from rill.engine_proc.model.loader import load_config

BLOCK_SIZE = 16
needs_kernel = pytest.mark.skipif(not cpu_attention.available(), reason="no C++ compiler: the kernel is not built")


def test_round_trip_error_is_within_half_a_step_of_each_rows_scale():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 64, generator=gen) * torch.rand(64, 3, 1, generator=gen) * 10
    x[0, 0] = 0.0  # a row of zeros: scale 0, no division by it
    rows = kv_int8.quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (64, 3, 68)
    back = kv_int8.dequantize_rows(rows, torch.float32)
    scale = x.abs().amax(-1, keepdim=True) / 127
    err = (back - x).abs()
    assert torch.all(err <= scale * 0.5 * (1 + 1e-5) + 1e-12)
    assert torch.equal(back[0, 0], torch.zeros(64))
    # The largest value of each row is exact, up to its scale's float rounding; the error is not all zero.
    assert torch.allclose(back.abs().amax(-1), x.abs().amax(-1), rtol=1e-6)
    assert err.max() > scale.max() * 0.3


def test_int8_holds_about_twice_the_blocks_of_bfloat16(model_dir):
    config = load_config(model_dir)
    bf16 = num_blocks_for_memory(config, torch.bfloat16, BLOCK_SIZE, 2**30)
    int8 = num_blocks_for_memory(config, torch.bfloat16, BLOCK_SIZE, 2**30, kv_cache_dtype="int8")
    assert 1.85 < int8 / bf16 < 2.0  # 128 bytes a row against 64 + a 4-byte scale
    cache = KVCache(config, num_blocks=int8, block_size=BLOCK_SIZE, dtype=torch.bfloat16, kv_cache_dtype="int8")
    assert cache.k_caches[0].dtype == torch.int8 and cache.k_caches[0].shape[-1] == cache.head_dim + 4
    assert cache.num_bytes == int8 * bytes_per_block(config, torch.bfloat16, BLOCK_SIZE, kv_cache_dtype="int8") <= 2**30


def case(num_seqs: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0):
    """Float K/V, written through the torch twin into shuffled blocks; queries; lengths from 1 to 8 blocks."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 1 + num_seqs * 8
    width = kv_int8.row_bytes(head_dim)
    k_cache = torch.zeros(num_blocks, BLOCK_SIZE, kv_heads, width, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    k = (torch.randn(num_blocks * BLOCK_SIZE, kv_heads, head_dim, generator=gen) * 2).to(dtype)
    v = torch.randn(num_blocks * BLOCK_SIZE, kv_heads, head_dim, generator=gen).to(dtype)
    kv_int8.write_kv_int8(k_cache, v_cache, k, v, torch.arange(num_blocks * BLOCK_SIZE))
    lens = torch.randint(1, 8 * BLOCK_SIZE + 1, (num_seqs,), generator=gen)
    lens[0] = 1
    table = (torch.randperm(num_blocks - 1, generator=gen)[: num_seqs * 8] + 1).view(num_seqs, 8)
    q = torch.randn(num_seqs, heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, table, lens, k.view(num_blocks, BLOCK_SIZE, kv_heads, head_dim), v.view_as(
        k.view(num_blocks, BLOCK_SIZE, kv_heads, head_dim))


def float_decode(q, k, v, table, lens) -> torch.Tensor:
    """Attention over the original (unquantized) K/V, in float32."""
    out = torch.empty(q.shape, dtype=torch.float32)
    for b in range(q.shape[0]):
        n = int(lens[b])
        kb = k[table[b]].flatten(0, 1)[:n].float().transpose(0, 1)
        vb = v[table[b]].flatten(0, 1)[:n].float().transpose(0, 1)
        out[b] = F.scaled_dot_product_attention(q[b].float().unsqueeze(1), kb, vb, enable_gqa=True).squeeze(1)
    return out


@needs_kernel
def test_the_kernels_writes_are_the_torch_twins_bytes():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        k = torch.randn(40, 3, 64, generator=gen).to(dtype)
        v = torch.randn(40, 3, 64, generator=gen).to(dtype)
        slots = torch.randperm(64, generator=gen)[:40]
        mine = [torch.zeros(4, BLOCK_SIZE, 3, 68, dtype=torch.int8) for _ in range(2)]
        twin = [torch.zeros_like(mine[0]) for _ in range(2)]
        torch.ops.rill_cpu.write_kv(*mine, k, v, slots)
        kv_int8.write_kv_int8(*twin, k, v, slots)
        assert torch.equal(mine[0], twin[0]) and torch.equal(mine[1], twin[1])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 3, 64), (4, 4, 32), (8, 2, 128), (6, 2, 48)],
                         ids=["gqa3-d64", "mha-d32", "gqa4-d128", "rows-d48"])
@pytest.mark.parametrize("num_seqs", [1, 5])
def test_decode_kernel_matches_attention_over_the_dequantized_cache(dtype, shape, num_seqs):
    """The fast (tiled) path for heads of 32, 64, 128 and the row-at-a-time one (48) against the torch
    twin, tightly; against attention over the unquantized K/V, within int8's error."""
    q, k_cache, v_cache, table, lens, k, v = case(num_seqs, *shape, dtype)
    got = torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, table, lens)
    twin = kv_int8.decode_reference(q.float(), k_cache, v_cache, table, lens)
    tight = 1e-5 if dtype == torch.float32 else 1.6e-2  # bfloat16: the output's own rounding
    torch.testing.assert_close(got.float(), twin, atol=tight, rtol=tight)
    loose = (got.float() - float_decode(q, k, v, table, lens)).abs().max()
    assert loose < 0.05, loose  # int8 K/V: about 0.4% of a row's range per value


@needs_kernel
def test_decode_writes_the_new_rows_first_and_takes_the_window():
    q, k_cache, v_cache, table, lens, _, _ = case(3, 6, 2, 64, torch.float32, seed=2)
    k_new, v_new = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    slots = table[torch.arange(3), (lens - 1) // BLOCK_SIZE] * BLOCK_SIZE + (lens - 1) % BLOCK_SIZE
    twin_k, twin_v = k_cache.clone(), v_cache.clone()
    got = torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, table, lens, k_new, v_new, slots, 20)
    kv_int8.write_kv_int8(twin_k, twin_v, k_new, v_new, slots)
    assert torch.equal(k_cache, twin_k) and torch.equal(v_cache, twin_v)
    want = torch.empty_like(q)
    for b in range(3):  # the last 20 keys of each row
        n = int(lens[b])
        kb = kv_int8.gather_dequant(twin_k, table[b], n, torch.float32)[max(0, n - 20):].transpose(0, 1)
        vb = kv_int8.gather_dequant(twin_v, table[b], n, torch.float32)[max(0, n - 20):].transpose(0, 1)
        want[b] = F.scaled_dot_product_attention(q[b].unsqueeze(1), kb, vb, enable_gqa=True).squeeze(1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_is_the_twins_dequantized_context(dtype):
    _, k_cache, _, table, _, _, _ = case(2, 6, 2, 64, dtype, seed=3)
    for length in (1, 37, 128):
        got = torch.ops.rill_cpu.kv_int8_gather(k_cache, table[1], length, torch.empty(0, dtype=dtype))
        assert torch.equal(got, kv_int8.gather_dequant(k_cache, table[1], length, dtype))


@needs_kernel
def test_prompt_chunk_over_an_int8_context_matches_float_attention():
    """The CPU backend's prompt path: a chunk after 40 cached tokens reads them dequantized (tight
    against SDPA over the dequantized context, loose against the original K/V)."""
    from rill.engine_proc.attention.kv_cache import AttentionMetadata, PrefillChunk

    gen = torch.Generator().manual_seed(4)
    backend = cpu_attention.CpuBackend(torch.device("cpu"), BLOCK_SIZE, torch.float32, "int8")
    assert backend.gather is not None
    k_cache = torch.zeros(8, BLOCK_SIZE, 2, 68, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    table = torch.tensor([5, 2, 7, 1])
    k_all, v_all = torch.randn(56, 2, 64, generator=gen), torch.randn(56, 2, 64, generator=gen)
    slots = table[torch.arange(56) // BLOCK_SIZE] * BLOCK_SIZE + torch.arange(56) % BLOCK_SIZE
    backend.write(k_cache, v_cache, k_all[:40], v_all[:40], slots[:40])
    q = torch.randn(16, 6, 64, generator=gen)
    mask = torch.arange(56).unsqueeze(0) <= torch.arange(40, 56).unsqueeze(1)
    meta = AttentionMetadata(slot_mapping=slots[40:], prefills=[PrefillChunk(0, 16, 40, table, 56, mask)])
    got = backend.forward(q, k_all[40:], v_all[40:], k_cache, v_cache, meta)

    def sdpa(k, v):
        return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                              enable_gqa=True).transpose(0, 1)

    dequant = [kv_int8.gather_dequant(c, table, 56, torch.float32) for c in (k_cache, v_cache)]
    torch.testing.assert_close(got, sdpa(*dequant), atol=1e-5, rtol=1e-5)
    assert (got - sdpa(k_all, v_all)).abs().max() < 0.05


@needs_kernel
def test_runner_greedy_text_with_an_int8_cache_stays_close_to_bfloat16s(model_dir, tokenizer):
    """A bound on disagreement, not equality: of 3 prompts x 16 greedy tokens, the tokens before each
    prompt's first difference are at least 70% of all (bench/kernels/kv_cache_int8.py measures more)."""
    from tests.helpers.generation import generate
    from tests.helpers.runners import make_runner

    prompts = [tokenizer.encode(t).ids for t in (
        "The capital of France is", "def fibonacci(n):\n    ",
        "Once upon a time, in a small village by the sea, there lived")]
    outs = {}
    for kv in ("auto", "int8"):
        runner = make_runner(model_dir, num_kv_blocks=64, eos_token_ids=[2], dtype=torch.bfloat16, block_size=BLOCK_SIZE,
                             attention_backend="cpu", kv_cache_dtype=kv)
        outs[kv] = generate(runner, prompts, max_tokens=16, chunk_len=5)  # chunks read the int8 context back
    assert runner.kv_cache.k_caches[0].dtype == torch.int8
    agreed = 0
    for a, b in zip(outs["auto"], outs["int8"]):
        agreed += next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    assert agreed >= 0.7 * 3 * 16, (agreed, outs)


@needs_kernel
def test_runner_fused_prompt_layers_write_the_same_int8_cache_as_layer_by_layer(model_dir, tokenizer):
    """The fused prompt layers (kernels/prefill_layer.py, where this CPU has them) quantize their K/V writes
    as write_kv does: the same cache bytes, the same logits, as the layer-by-layer path."""
    from tests.helpers.generation import generate_logits
    from tests.helpers.runners import make_runner

    runner = make_runner(model_dir, num_kv_blocks=16, eos_token_ids=[2], dtype=torch.bfloat16, block_size=BLOCK_SIZE,
                         attention_backend="cpu", kv_cache_dtype="int8")
    if not runner.attention.fused_prompt_layers:
        pytest.skip("no fused prompt layers on this CPU (neither AMX nor AVX-512 BF16)")
    prompt = [tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3).ids]
    fused = generate_logits(runner, prompt)
    fused_cache = runner.kv_cache._storage.clone()
    runner.kv_cache._storage.zero_()
    runner.attention.fused_prompt_layers = False  # the layer-by-layer path, on the same runner
    by_layer = generate_logits(runner, prompt)
    # Rows equal but for the few the two paths' K projections round differently in bfloat16.
    assert (fused_cache != runner.kv_cache._storage).float().mean() < 0.01
    torch.testing.assert_close(fused, by_layer, atol=0.1, rtol=0.05)
