"""The CPU paged decode kernel (engine_proc/attention/cpu.py) against the torch path it replaces."""
from __future__ import annotations

import logging

import pytest
import torch

from rill.engine_proc.attention import cpu as cpu_attention
from rill.engine_proc.attention.choice import resolve_attention_backend
from rill.engine_proc.attention.kv_cache import additive_mask, decode_attention
from rill.engine_proc.kernels import extension
from tests.helpers.generation import step_logits
from tests.helpers.runners import make_runner

BLOCK_SIZE = 16


def case(num_seqs: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0):
    """Random caches, a shuffled block table, lengths from 1 to a few blocks, queries as a strided view."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 1 + num_seqs * 8
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim, generator=gen).to(dtype)
    lens = torch.randint(1, 8 * BLOCK_SIZE + 1, (num_seqs,), generator=gen)
    lens[0] = 1
    if num_seqs > 1:
        lens[1] = 3 * BLOCK_SIZE  # a whole number of blocks
    table = (torch.randperm(num_blocks - 1, generator=gen)[: num_seqs * 8] + 1).view(num_seqs, 8)
    table = table[:, : -(-int(lens.max()) // BLOCK_SIZE)]
    # q as attention sees it: a slice of the fused qkv projection, not contiguous.
    qkv = torch.randn(num_seqs, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    return qkv[:, :heads], k_cache, v_cache, table, lens


def reference(q, k_cache, v_cache, table, lens) -> torch.Tensor:
    """The torch path in float64: gathered blocks, SDPA with an additive mask."""
    f64 = torch.float64
    mask = additive_mask(lens, table, k_cache.to(f64))
    return decode_attention(q.to(f64), k_cache.to(f64), v_cache.to(f64), table, mask)


def clear_kernels() -> None:
    extension.available.cache_clear()


needs_kernel = pytest.mark.skipif(not cpu_attention.available(), reason="no C++ compiler: the kernel is not built")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 3, 64), (4, 4, 32), (8, 2, 128)], ids=["gqa3-d64", "mha-d32", "gqa4-d128"])
@pytest.mark.parametrize("num_seqs", [1, 5, 33])
def test_kernel_matches_the_torch_path(dtype, shape, num_seqs):
    q, k_cache, v_cache, table, lens = case(num_seqs, *shape, dtype)
    got = cpu_attention.paged_decode(q, k_cache, v_cache, table, lens)
    assert got is not None and got.dtype == dtype and got.shape == q.shape
    want = reference(q, k_cache, v_cache, table, lens)
    torch_path = decode_attention(q, k_cache, v_cache, table, additive_mask(lens, table, k_cache))
    # Within what the torch path itself gets in this dtype, against the same float64 reference.
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    assert (got.double() - want).abs().max() <= 2 * (torch_path.double() - want).abs().max() + 1e-6


def masked_reference(q, k_cache, v_cache, table, lens, window, softcap, sinks) -> torch.Tensor:
    """Each row's attention in float64 as transformers' eager layers write it: scaled scores,
    soft-capped, keys before the window masked, the sink a last column dropped after the softmax."""
    f64, (_, heads, head_dim), kv_heads = torch.float64, q.shape, k_cache.shape[2]
    out = []
    for b, length in enumerate(lens.tolist()):
        keys = k_cache[table[b]].reshape(-1, kv_heads, head_dim)[:length].to(f64).repeat_interleave(heads // kv_heads, 1)
        values = v_cache[table[b]].reshape(-1, kv_heads, head_dim)[:length].to(f64).repeat_interleave(heads // kv_heads, 1)
        scores = torch.einsum("hd,lhd->hl", q[b].to(f64), keys) * head_dim**-0.5
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if window:
            scores[:, : max(0, length - window)] = float("-inf")
        if sinks is not None:
            scores = torch.cat([scores, sinks.to(f64).view(heads, 1)], dim=1)
        out.append(torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1)[:, :length], values))
    return torch.stack(out)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 2, 64), (6, 6, 128), (8, 1, 32), (6, 2, 80)],
                         ids=["gqa4-d64", "mha-d128", "gqa8-d32", "gqa3-d80"])
@pytest.mark.parametrize("masking", [(37, 0.0, False), (0, 30.0, False), (0, 0.0, True), (50, 20.0, True),
                                     (BLOCK_SIZE, 0.0, True)], ids=["window", "softcap", "sinks", "all", "window=block"])
def test_kernel_masks_windows_softcaps_and_sinks(dtype, shape, masking):
    """The transformers route's Gemma 2, Mistral and GPT-OSS layers (engine_proc/model/hf_attention.py):
    the blocks wholly before a row's window are never read, so the scheduler may release them (here
    they point at a block of NaNs)."""
    window, softcap, with_sinks = masking
    q, k_cache, v_cache, table, lens = case(7, *shape, dtype, seed=3)
    q = q * 4  # sharper softmaxes, so a wrong mask or cap shows
    sinks = torch.randn(shape[0], generator=torch.Generator().manual_seed(4)) if with_sinks else None
    want = masked_reference(q, k_cache, v_cache, table, lens, window, softcap, sinks)
    released = table.clone()
    for b, length in enumerate(lens.tolist()):
        released[b, : max(0, length - window) // BLOCK_SIZE if window else 0] = 0
    k_cache[0], v_cache[0] = float("nan"), float("nan")
    got = torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, released, lens, None, None, None, window, softcap, sinks)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@needs_kernel
def test_kernel_writes_the_new_kv_first_and_attends_to_it():
    q, k_cache, v_cache, table, lens = case(6, 9, 3, 64, torch.float32, seed=1)
    gen = torch.Generator().manual_seed(2)
    k_new, v_new = torch.randn(2, 6, 3, 64, generator=gen)
    last = lens - 1  # each row's new token is its last position
    slots = table.gather(1, (last // BLOCK_SIZE).unsqueeze(1)).squeeze(1) * BLOCK_SIZE + last % BLOCK_SIZE
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k.view(-1, 3, 64)[slots] = k_new
    expected_v.view(-1, 3, 64)[slots] = v_new
    got = cpu_attention.paged_decode(q, k_cache, v_cache, table, lens, k_new, v_new, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    torch.testing.assert_close(got.double(), reference(q, expected_k, expected_v, table, lens), atol=1e-5, rtol=1e-5)


@needs_kernel
def test_a_row_does_not_depend_on_the_others_or_on_the_thread_count():
    """Each row is computed alone, in one thread, in a fixed order: bit-identical whatever the batch."""
    q, k_cache, v_cache, table, lens = case(33, 9, 3, 64, torch.bfloat16, seed=3)
    together = cpu_attention.paged_decode(q, k_cache, v_cache, table, lens)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [cpu_attention.paged_decode(q[i : i + 1], k_cache, v_cache, table[i : i + 1], lens[i : i + 1])
                 for i in (0, 7, 32)]
    finally:
        torch.set_num_threads(threads)
    for row, got in zip((0, 7, 32), alone):
        assert torch.equal(got[0], together[row]), f"row {row}"


def test_what_the_kernel_does_not_take_goes_to_the_torch_path():
    q, k_cache, v_cache, table, lens = case(3, 4, 2, 32, torch.float16)
    assert cpu_attention.paged_decode(q, k_cache, v_cache, table, lens) is None  # float16: not built for it


def test_no_compiler_means_no_kernel_and_the_torch_backend(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("RILL_CACHE", str(tmp_path))
    clear_kernels()
    try:
        with caplog.at_level(logging.WARNING, logger="rill.model"):
            assert not cpu_attention.available()
        assert "could not be built" in caplog.text
        assert resolve_attention_backend("auto", torch.device("cpu")) == "torch"
        with pytest.raises(ValueError, match="--attention-backend torch"):
            resolve_attention_backend("cpu", torch.device("cpu"))
        q, k_cache, v_cache, table, lens = case(2, 4, 2, 32, torch.float32)
        assert cpu_attention.paged_decode(q, k_cache, v_cache, table, lens) is None
    finally:
        clear_kernels()


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("RILL_CPU_KERNELS", "0")
    clear_kernels()
    try:
        assert not cpu_attention.available()
    finally:
        clear_kernels()


@needs_kernel
def test_cpu_backend_runner_matches_the_torch_runner(tiny_model_dir):  # noqa: F811 (fixture)
    """Mixed steps (chunked prefills beside decodes): the kernel's decode rows against SDPA's."""
    import random

    rng = random.Random(4)
    prompts = [[rng.randrange(3, 128) for _ in range(n)] for n in (20, 37, 9)]
    make = lambda backend: make_runner(tiny_model_dir, num_kv_blocks=24, block_size=BLOCK_SIZE,  # noqa: E731
                                       eos_token_ids=[2], attention_backend=backend)
    assert resolve_attention_backend("auto", torch.device("cpu")) == "cpu"
    cpu_runner, torch_runner = make("auto"), make("torch")
    assert cpu_runner.attention_backend == "cpu"
    got, got_tokens = step_logits(cpu_runner, prompts, chunk_len=16, num_steps=6)
    want, want_tokens = step_logits(torch_runner, prompts, chunk_len=16, num_steps=6)
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")
    assert got_tokens == want_tokens
