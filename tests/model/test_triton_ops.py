"""The GPU's fused elementwise ops (engine_proc/kernels/triton_ops.py) against their torch twin.

Without a GPU they run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, set before the
kernels are decorated); with one, compiled on CUDA tensors (the GPU tier).
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel is decorated
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"

pytest.importorskip("triton", reason="triton is not installed (pip install -e .[test] on Linux)")

from rill.engine_proc.kernels.fused_ops import TorchOps  # noqa: E402
from rill.engine_proc.kernels.triton_ops import TritonOps  # noqa: E402

TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [576, 64])  # the bundled model's (not a power of two), and a small one
def test_add_rms_norm_matches_the_twin(dtype, hidden):
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(5, hidden, generator=gen).to(dtype) * 3 for _ in range(2))
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    want_normed, want_total = TorchOps.add_rms_norm(x, residual, weight, 1e-5)
    got_normed, got_total = TritonOps.add_rms_norm(x.to(DEVICE), residual.to(DEVICE), weight.to(DEVICE), 1e-5)
    # The add rounds as the twin's: exactly in float32; in bfloat16 within one unit of the last place
    # (Triton's interpreter truncates where the GPU rounds to nearest).
    torch.testing.assert_close(got_total.cpu(), want_total, atol=0, rtol=0 if dtype == torch.float32 else 2**-7)
    torch.testing.assert_close(got_normed.cpu(), want_normed, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_heads_rotates_the_first_heads_of_a_strided_view(dtype):
    gen = torch.Generator().manual_seed(1)
    tokens, heads, kv_heads, head_dim = 4, 6, 2, 32
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    angles = torch.rand(tokens, 1, head_dim // 2, generator=gen) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    want = TorchOps.rope_heads(qkv, heads + kv_heads, cos, sin)
    got = TritonOps.rope_heads(qkv.to(DEVICE), heads + kv_heads, cos.to(DEVICE), sin.to(DEVICE))
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, **TOLERANCE[dtype])
    # Qwen3's path: the k heads alone, a view of qkv past the q heads.
    k = qkv[:, heads:heads + kv_heads]
    torch.testing.assert_close(TritonOps.rope_heads(k.to(DEVICE), kv_heads, cos.to(DEVICE), sin.to(DEVICE)).cpu(),
                               TorchOps.rope_heads(k, kv_heads, cos, sin), **TOLERANCE[dtype])


def test_the_ops_are_opaque_to_torch_compile():
    """Traced as one op each (what Inductor leaves whole on a GPU), with the twin's results."""
    gen = torch.Generator().manual_seed(2)
    x, residual = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)
    weight, angles = torch.rand(64, generator=gen), torch.rand(3, 1, 8, generator=gen)

    def step(x, residual):
        normed, total = TritonOps.add_rms_norm(x, residual, weight, 1e-6)
        return TritonOps.rope_heads(normed.view(3, 4, 16), 3, angles.cos(), angles.sin()), total

    graphs = []
    compiled = torch.compile(step, backend=lambda gm, _: graphs.append(gm) or gm, fullgraph=True)
    got = compiled(x, residual)
    want_normed, want_total = TorchOps.add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(got[1], want_total)
    torch.testing.assert_close(got[0], TorchOps.rope_heads(want_normed.view(3, 4, 16), 3, angles.cos(), angles.sin()))
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {"rill.add_rms_norm", "rill.rope_heads"} <= targets, targets


def test_the_start_check_passes_on_the_kernels_and_fails_on_a_broken_one(monkeypatch):
    from rill.engine_proc.kernels import triton_ops

    triton_ops.works_on.cache_clear()
    assert triton_ops.works_on(torch.device(DEVICE), torch.float32)
    triton_ops.works_on.cache_clear()
    monkeypatch.setattr(TritonOps, "rope_heads", staticmethod(lambda x, n, cos, sin: TorchOps.rope_heads(x, n, sin, cos)))
    assert not triton_ops.works_on(torch.device(DEVICE), torch.float32)  # a wrong result: torch's ops serve
    triton_ops.works_on.cache_clear()
