"""The GPU's decode kernels (engine_proc/attention/triton_decode.py) against their torch twins.

As test_triton_kernels.py: without a GPU under Triton's interpreter on CPU tensors, with one compiled
and run on CUDA tensors (the GPU tier), the references computed on the CPU in both.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel is decorated
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e .[test] on Linux)")

from rill.engine_proc.attention.kv_cache import write_kv  # noqa: E402
from rill.engine_proc.attention.triton_decode import (  # noqa: E402
    decode_attention_triton,
    num_splits,
    write_kv_triton,
)
from tests.helpers.paged_steps import build_step, per_token_reference  # noqa: E402

# Decode rows only: contexts of 1, of exact block multiples, mid-block, and over one key tile (64).
DECODES = [(0, 1), (15, 1), (31, 1), (8, 1), (70, 1), (127, 1)]


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("num_kv_heads, head_dim", [(1, 16), (3, 24), (2, 64)])
def test_write_kv_kernel_matches_write_kv(gen, num_kv_heads, head_dim):
    shape = (9, 4, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(36, generator=gen)[:7]
    # k and v as the model hands them over: views into one qkv row, not contiguous over heads.
    qkv = torch.randn(7, 2 + 2 * num_kv_heads, head_dim, generator=gen)
    k, v = qkv[:, 2:2 + num_kv_heads], qkv[:, 2 + num_kv_heads:]
    write_kv(want_k, want_v, k, v, slots)
    got_k, got_v = k_cache.to(DEVICE), v_cache.to(DEVICE)
    write_kv_triton(got_k, got_v, k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE))
    assert torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(2, 2, 16), (9, 3, 64), (6, 2, 24)])
@pytest.mark.parametrize("splits", [1, 4])  # 4: the 128-key context in 2 runs, the 1-key one in 1, empty runs too
def test_decode_kernel_matches_per_token_reference(gen, block_size, num_heads, num_kv_heads, head_dim, splits):
    # NaN in every slot no sequence owns and a block id past the cache in the padding: read neither.
    s = build_step(DECODES, block_size, num_heads, num_kv_heads, head_dim, torch.float32, gen, float("nan"))
    scale = head_dim**-0.5
    args = [s[name].to(DEVICE) for name in ("q", "k_cache", "v_cache", "block_tables", "context_lens")]
    out = decode_attention_triton(*args, scale, splits=splits).cpu()
    assert out.shape == s["q"].shape
    torch.testing.assert_close(out.double(), per_token_reference(s, scale), atol=1e-5, rtol=1e-5)


def test_splits_fill_two_waves_of_multiprocessors():
    assert num_splits(3, 132) == 16  # batch 1, 3 KV heads: as many as allowed
    assert num_splits(96, 132) == 2  # batch 32: 192 programs
    assert num_splits(300, 132) == 1  # already more than two waves
    assert num_splits(24, 132, most=4) == 4


def test_decode_kernel_half_precision(gen):
    if DEVICE == "cpu":  # the interpreter has no bf16 or fp16 tl.dot (see test_triton_kernels.py)
        pytest.skip("Triton's interpreter multiplies half-precision bit patterns; the GPU tier runs this case")
    s = build_step(DECODES, 16, 9, 3, 64, torch.bfloat16, gen, float("nan"))
    args = [s[name].to(DEVICE) for name in ("q", "k_cache", "v_cache", "block_tables", "context_lens")]
    for splits in (1, 8):
        out = decode_attention_triton(*args, 64**-0.5, splits=splits).cpu()
        torch.testing.assert_close(out.double(), per_token_reference(s, 64**-0.5), atol=2e-2, rtol=2e-2)
