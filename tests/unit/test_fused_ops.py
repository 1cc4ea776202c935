"""The eager step's fused elementwise ops (engine_proc/kernels/fused_ops.py, csrc/elementwise.cpp) against torch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rill.engine_proc.kernels import extension, torch_ops
from rill.engine_proc.kernels.fused_ops import CpuOps, TorchOps, elementwise_ops

needs_kernels = pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the kernels are not built")
DTYPES = [torch.float32, torch.bfloat16]


def no_worse_than_torch(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor) -> None:
    """Within what torch's own eager ops get in this dtype, against the same float64 result."""
    assert got.dtype == eager.dtype and got.shape == exact.shape
    err, torch_err = (got.double() - exact).abs().max(), (eager.double() - exact).abs().max()
    assert err <= torch_err * 1.01 + 1e-6, (err.item(), torch_err.item())


def rope_tables(num_tokens: int, head_dim: int, dtype: torch.dtype):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.arange(num_tokens).float()[:, None] * inv_freq[None] * 7  # positions 0, 7, 14, ...
    return freqs.cos().to(dtype)[:, None], freqs.sin().to(dtype)[:, None]


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 576, generator=gen) * 3).to(dtype)
    w = torch.randn(576, generator=gen).to(dtype)
    got = CpuOps.rms_norm(x, w, 1e-5)
    no_worse_than_torch(got, F.rms_norm(x, (576,), w, 1e-5), F.rms_norm(x.double(), (576,), w.double(), 1e-5))
    # A strided input (a head slice, as Qwen3's q_norm gets) and the result of a 3-D one.
    heads = torch.randn(5, 12, 64, generator=gen).to(dtype)
    hw = torch.randn(64, generator=gen).to(dtype)
    got = CpuOps.rms_norm(heads[:, :9], hw, 1e-6)
    no_worse_than_torch(got, F.rms_norm(heads[:, :9], (64,), hw, 1e-6),
                        F.rms_norm(heads[:, :9].double(), (64,), hw.double(), 1e-6))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_gives_the_bits_of_the_add_then_the_norm(dtype):
    gen = torch.Generator().manual_seed(3)
    x, residual = ((torch.randn(37, 576, generator=gen) * 3).to(dtype) for _ in range(2))
    w = torch.randn(576, generator=gen).to(dtype)
    normed, total = CpuOps.add_rms_norm(x, residual, w, 1e-5)
    assert torch.equal(total, residual + x)
    assert torch.equal(normed, CpuOps.rms_norm(residual + x, w, 1e-5))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    gen = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(33, 2 * 1536, generator=gen) * 4).to(dtype)
    gate_up[0, :8] = torch.tensor([-100.0, -90, -30, 0, 30, 90, 100, 1e-3])  # past exp's range, both ways
    gate, up = gate_up.split(1536, dim=-1)
    got = CpuOps.silu_mul(gate_up)
    exact = F.silu(gate.double()) * up.double()
    no_worse_than_torch(got, F.silu(gate) * up, exact)
    assert torch.isfinite(got).all()


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_soft_cap(dtype):
    """A family's final logit soft-capping (engine_proc/model/hf_paged.py), over logits far past the cap."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(7, 49152, generator=gen) * 40).to(dtype)
    got = torch.ops.rill_cpu.soft_cap(logits, 30.0)
    exact = 30.0 * torch.tanh(logits.double() / 30.0)
    if dtype == torch.float32:  # tanh's cancellation near 0 in float32: a few units of 1e-6
        torch.testing.assert_close(got.double(), exact, atol=1e-5, rtol=1e-6)
    else:
        no_worse_than_torch(got, 30.0 * torch.tanh(logits / 30.0), exact)
    assert got.abs().max() <= 30.0 and got.shape == logits.shape


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_in_place_rotates_only_the_heads_asked(dtype):
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(29, 9 + 2 * 3, 64, generator=gen).to(dtype)
    cos, sin = rope_tables(29, 64, dtype)
    before = qkv.clone()
    exact = torch_ops.apply_rope(before[:, :12].double(), cos.double(), sin.double())
    got = CpuOps.rope_heads(qkv, 12, cos, sin)
    assert got.data_ptr() == qkv.data_ptr()  # in place: q and k stay views of qkv
    no_worse_than_torch(got, torch_ops.apply_rope(before[:, :12], cos, sin), exact)
    assert torch.equal(qkv[:, 12:], before[:, 12:])  # v untouched


def test_where_not_fused_the_torch_ops_run():
    """float16 (no kernel for it): the plain torch ops, and rope returns a new tensor."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 64, generator=gen).to(torch.float16)
    w = torch.ones(64, dtype=torch.float16)
    ops = elementwise_ops(w)  # chosen once per model, from its weights
    assert ops is TorchOps
    cos, sin = rope_tables(4, 64, torch.float16)
    rotated = ops.rope_heads(x, 2, cos, sin)
    assert rotated.data_ptr() != x.data_ptr()
    assert torch.equal(rotated, torch_ops.apply_rope(x[:, :2], cos, sin))
    assert torch.equal(ops.rms_norm(x, w, 1e-5), F.rms_norm(x, (64,), w, 1e-5))
    gate_up = torch.randn(4, 16, generator=gen).to(torch.float16)
    assert torch.equal(ops.silu_mul(gate_up), F.silu(gate_up[:, :8]) * gate_up[:, 8:])


@needs_kernels
def test_the_fused_ops_are_chosen_for_cpu_float_weights_once_loaded():
    assert elementwise_ops(torch.ones(8, dtype=torch.bfloat16)) is CpuOps
    assert elementwise_ops(torch.ones(8)) is CpuOps
    assert elementwise_ops(torch.ones(8, device="meta")) is TorchOps  # another device: torch's


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_stores_each_token_at_its_slot(dtype):
    """The C++ write (kv_cache.write_kv on the CPU) against index_copy_, from views of a fused qkv
    as the model passes them, to scattered slots."""
    from rill.engine_proc.attention.kv_cache import write_kv

    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(21, 9 + 2 * 3, 64, generator=gen).to(dtype)
    k, v = qkv[:, 9:12], qkv[:, 12:]
    slots = torch.randperm(10 * 16, generator=gen)[:21]
    caches = [torch.zeros(10, 16, 3, 64, dtype=dtype) for _ in range(4)]
    write_kv(caches[0], caches[1], k, v, slots)
    caches[2].view(-1, 3, 64).index_copy_(0, slots, k)
    caches[3].view(-1, 3, 64).index_copy_(0, slots, v)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    with pytest.raises(RuntimeError, match="slot past the cache"):
        torch.ops.rill_cpu.write_kv(caches[0], caches[1], k, v, slots + 1000)
