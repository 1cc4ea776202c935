"""The Triton kernels against their torch twins: paged attention and fused sampling.

Without a GPU they run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, set
here before the kernels are decorated). With one they are compiled and run on CUDA tensors,
the references still computed on the CPU: the GPU tier's comparison of kernel and twin.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel is decorated
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e .[test] on Linux)")

from rill.engine_proc.attention.kv_cache import AttentionMetadata, PrefillChunk, paged_attention  # noqa: E402
from rill.engine_proc.attention.triton import (  # noqa: E402
    _paged_attention_kernel,
    paged_attention_triton,
    tile_lens_of,
)
from rill.engine_proc.sample.sampler import sample_tokens  # noqa: E402
from rill.engine_proc.sample.triton import _sample_kernel, sample_tokens_triton  # noqa: E402
from tests.helpers.paged_steps import build_step, per_token_reference  # noqa: E402

# A step as the engine lays it out: decodes first, then prefill chunks. (num_cached, num_new)
# per sequence: contexts of 1 and of exact block multiples, a fresh prefill, chunks on a
# cached prefix that end mid-block, and a chunk longer than one attention tile.
STEP = [(0, 1), (15, 1), (31, 1), (8, 1), (0, 7), (13, 9), (32, 3), (5, 20)]


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# ---- paged attention -------------------------------------------------------------------


def run_triton_attention(s, scale):
    names = ["q", "k_cache", "v_cache", "block_tables", "seq_of_token", "context_lens"]
    args = [s[name].to(DEVICE) for name in names]
    return paged_attention_triton(*args, scale).cpu()


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim",
    [(2, 2, 16), (4, 2, 32), (6, 2, 24)],  # plain, GQA, GQA with 3 heads a group and D = 24
)
def test_attention_matches_per_token_reference_fp32(gen, block_size, num_heads, num_kv_heads, head_dim):
    # NaN in every unowned slot and past the cache in the padding: the kernel must read neither.
    s = build_step(STEP, block_size, num_heads, num_kv_heads, head_dim, torch.float32, gen, float("nan"))
    scale = head_dim**-0.5
    out = run_triton_attention(s, scale)
    assert out.shape == s["q"].shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), per_token_reference(s, scale), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_half_precision_caches(gen, dtype):
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        # The interpreter keeps bf16 as uint16 and tl.dot multiplies the bit patterns
        # (triton-lang/triton#11584; its docs: no bf16 arithmetic in the interpreter).
        pytest.skip("Triton's interpreter has no bf16 tl.dot; the GPU tier runs this case")
    s = build_step(STEP, 16, 4, 2, 32, dtype, gen, float("nan"))
    out = run_triton_attention(s, 32**-0.5)
    assert out.dtype == dtype
    # fp32 accumulation: off by the rounding of probabilities to `dtype` before P @ V, no more.
    torch.testing.assert_close(out.double(), per_token_reference(s, 32**-0.5), atol=2e-2, rtol=2e-2)


def engine_metadata(step, s, block_size) -> AttentionMetadata:
    """The same step as the engine's model runner describes it to the CPU attention."""
    meta = AttentionMetadata(slot_mapping=s["slot_mapping"])
    decodes = [i for i, (_, new) in enumerate(step) if new == 1]
    context_lens = [step[i][0] + 1 for i in decodes]
    max_num_blocks = -(-max(context_lens) // block_size)
    meta.num_decode_tokens = len(decodes)
    padded = [(s["tables"][i] + [0] * max_num_blocks)[:max_num_blocks] for i in decodes]
    meta.decode_block_table = torch.tensor(padded)
    meta.decode_context_len = max(context_lens)
    key_pos = torch.arange(meta.decode_context_len)
    meta.decode_mask = (key_pos < torch.tensor(context_lens).unsqueeze(1)).view(len(decodes), 1, 1, -1)
    token_start = len(decodes)
    for i, (cached, new) in enumerate(step):
        if new == 1:
            continue
        chunk = PrefillChunk(token_start=token_start, token_end=token_start + new)
        if cached:
            chunk.block_table = torch.tensor(s["tables"][i])
            chunk.context_len = cached + new
            query_pos = torch.arange(cached, cached + new)
            chunk.causal_mask = torch.arange(cached + new).unsqueeze(0) <= query_pos.unsqueeze(1)
        meta.prefills.append(chunk)
        token_start += new
    return meta


def test_attention_matches_engine_paged_attention(gen):
    # Zeros in unowned slots, as KVCache allocates them: the CPU path reads whole blocks.
    s = build_step(STEP, 16, 4, 2, 32, torch.float32, gen, 0.0)
    flat_k = s["k_cache"].view(-1, 2, 32)
    k_new, v_new = flat_k[s["slot_mapping"]], s["v_cache"].view(-1, 2, 32)[s["slot_mapping"]]
    meta = engine_metadata(STEP, s, 16)
    expected = paged_attention(s["q"], k_new, v_new, s["k_cache"], s["v_cache"], meta)
    torch.testing.assert_close(run_triton_attention(s, 32**-0.5), expected, atol=1e-5, rtol=1e-5)


def test_tile_lens_split_runs_of_one_sequence():
    seq_of_token = torch.tensor([0, 1, 2, 2, 2, 2, 2, 3, 3, 1])
    assert tile_lens_of(seq_of_token, 2).tolist() == [1, 1, 2, 0, 2, 0, 1, 2, 0, 1]
    assert tile_lens_of(seq_of_token, 4).tolist() == [1, 1, 4, 0, 0, 0, 1, 2, 0, 1]


# ---- fused sampling --------------------------------------------------------------------


def sampling_inputs(gen, num_rows=16, vocab_size=300):
    logits = torch.randn(num_rows, vocab_size, generator=gen) * 3
    logits[0, :5] = float("-inf")  # stop tokens blocked before min_tokens
    temperature = torch.rand(num_rows, generator=gen) * 1.5 + 0.2
    noise = torch.empty(num_rows, vocab_size).exponential_(generator=gen)
    return logits, temperature, noise.clamp_(min=torch.finfo(torch.float32).tiny)


def pick(gen, choices, num_rows, dtype):
    return torch.tensor(choices, dtype=dtype)[torch.randint(len(choices), (num_rows,), generator=gen)]


def run_triton_sampler(logits, temperature, top_k, top_p, min_p, noise):
    inputs = (logits, temperature, top_k, top_p, min_p, noise)
    args = [None if x is None else x.to(DEVICE) for x in inputs]
    return sample_tokens_triton(*args).cpu()


@pytest.mark.parametrize("use_top_k", [False, True])
@pytest.mark.parametrize("use_top_p", [False, True])
@pytest.mark.parametrize("use_min_p", [False, True])
@pytest.mark.parametrize("vocab_size", [300, 5000])  # one vocabulary tile, and several
def test_sampler_matches_twin_on_the_same_noise(gen, use_top_k, use_top_p, use_min_p, vocab_size):
    num_rows = 16 if vocab_size < 1000 else 4
    logits, temperature, noise = sampling_inputs(gen, num_rows, vocab_size)
    top_k = pick(gen, [0, 1, 3, 20], num_rows, torch.long) if use_top_k else None
    top_p = pick(gen, [1.0, 0.95, 0.6, 0.2], num_rows, torch.float32) if use_top_p else None
    min_p = pick(gen, [0.0, 0.02, 0.1, 0.5], num_rows, torch.float32) if use_min_p else None
    expected = sample_tokens(logits, temperature, top_k, top_p, min_p, noise)
    got = run_triton_sampler(logits, temperature, top_k, top_p, min_p, noise)
    assert got.dtype == torch.long
    assert got.tolist() == expected.tolist()


def test_sampler_matches_twin_over_many_noise_draws(gen):
    """The same winners on 32 noise draws of a few rows: the filters cut where the twin's do."""
    logits, _, _ = sampling_inputs(gen, num_rows=4, vocab_size=64)
    temperature = torch.tensor([3.0, 2.0, 1.5, 3.0])
    top_k = torch.tensor([0, 10, 0, 5])
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.8])
    min_p = torch.tensor([0.05, 0.0, 0.0, 0.2])
    rows = [logits, temperature, top_k, top_p, min_p]
    logits, temperature, top_k, top_p, min_p = (x.repeat(32, *([1] * (x.dim() - 1))) for x in rows)
    noise = torch.empty_like(logits).exponential_(generator=gen)
    expected = sample_tokens(logits, temperature, top_k, top_p, min_p, noise)
    got = run_triton_sampler(logits, temperature, top_k, top_p, min_p, noise)
    assert got.tolist() == expected.tolist()
    draws = got.view(32, 4)
    assert all(len(set(draws[:, row].tolist())) > 1 for row in range(4))  # the draws do differ


@pytest.mark.parametrize(
    "filters",
    [
        dict(top_k=torch.ones(16, dtype=torch.long)),
        dict(top_p=torch.full((16,), 1e-6)),
        dict(min_p=torch.ones(16)),
        dict(top_k=torch.full((16,), 7), top_p=torch.full((16,), 1e-6), min_p=torch.full((16,), 0.3)),
    ],
    ids=["top_k_1", "tiny_top_p", "min_p_1", "all_three"],
)
def test_sampler_greedy_settings_are_argmax(gen, filters):
    logits, temperature, noise = sampling_inputs(gen)
    args = [filters.get(name) for name in ("top_k", "top_p", "min_p")]
    got = run_triton_sampler(logits, temperature, *args, noise)
    assert got.tolist() == logits.argmax(dim=-1).tolist()
    assert got.tolist() == sample_tokens(logits, temperature, *args, noise).tolist()


# ---- compiling for the GPU, without one ----------------------------------------------------


def compile_for_h100(kernel, signature: dict[str, str], constexprs: dict) -> str:
    """The kernel's PTX for sm_90, built by Triton's CUDA backend with no GPU present."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def compile_kernels_for_h100() -> None:
    """Both kernels through the compiler, in a process where the interpreter is off."""
    assert os.environ.get("TRITON_INTERPRET") == "0"
    pointers = ["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"]
    strides = ["stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_ks",
               "stride_kh", "stride_vb", "stride_vs", "stride_vh", "stride_table", "block_size"]
    for dtype, precision in [("fp32", "ieee"), ("bf16", "tf32")]:
        signature = {name: f"*{dtype}" for name in pointers}
        signature |= dict(block_tables_ptr="*i64", seq_of_token_ptr="*i64", context_lens_ptr="*i64",
                          tile_lens_ptr="*i32", scale_log2e="fp32")
        signature |= {name: "i32" for name in strides}
        constexprs = dict(GROUP=7, GROUP_PAD=8, HEAD_DIM=64, HEAD_DIM_PAD=64, BLOCK_M=16,
                          BLOCK_N=32, DOT_PRECISION=precision)
        ptx = compile_for_h100(_paged_attention_kernel, signature, constexprs)
        assert ".entry _paged_attention_kernel" in ptx
        assert dtype == "fp32" or "mma" in ptx  # bf16 on the tensor cores; exact fp32 as FMAs
    pointers = ["logits_ptr", "noise_ptr", "temperature_ptr", "cutoff_ptr", "min_p_ptr"]
    for filters_on in (False, True):
        signature = {name: "*fp32" for name in pointers}
        signature |= dict(out_ptr="*i64", vocab_size="i32", stride_logits="i32", stride_noise="i32")
        constexprs = dict(HAS_CUTOFF=filters_on, HAS_MIN_P=filters_on, BLOCK_V=2048)
        ptx = compile_for_h100(_sample_kernel, signature, constexprs)
        # Every division IEEE-rounded like the twin's, none the GPU's approximate `/`.
        assert "div.rn.f32" in ptx and "div.full" not in ptx


def test_kernels_compile_for_h100():
    """The interpreter runs the kernels as plain Python and lets through what the compiler
    rejects; this catches that half (not what only the GPU's numerics would show). In a
    subprocess: kernels decorated for the interpreter cannot be compiled."""
    code = "from tests.model.test_triton_kernels import compile_kernels_for_h100; compile_kernels_for_h100()"
    result = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "0"},
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
