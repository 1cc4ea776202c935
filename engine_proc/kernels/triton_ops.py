"""The GPU's fused elementwise ops in Triton, each one kernel behind an opaque op (torch.library), with
TorchOps (fused_ops.py) as their twin.

Compiled, Inductor had made each residual add and RMSNorm four kernels on an H100: the add folded into
the previous matmul's epilogue, which needs a copy of the residual first, then the norm as a reduction
and a pointwise pass (three of every layer's ~16 kernels, twice). `rill::add_rms_norm` is one kernel:
the add, rounded once to the stream's dtype, and the norm of that sum, float32 inside. `rill::rope_heads`
rotates q and k in one kernel where Inductor made two. Opaque, Inductor leaves them whole and the
matmuls around them plain. Under Triton's interpreter (TRITON_INTERPRET=1) they run on CPU tensors, for
the tests.
"""
from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from rill.engine_proc.kernels.torch_ops import TorchOps

log = logging.getLogger("rill.model")


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, total_ptr, out_ptr, eps, stride_x, stride_r, stride_t, stride_o,
                         N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    total = (x + r).to(total_ptr.dtype.element_ty)  # the sum as the stream holds it, as the twin's add rounds
    tl.store(total_ptr + row * stride_t + cols, total, mask=mask)
    t = total.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(t * t, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (t * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("rill::add_rms_norm", mutates_args=())
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x) * weight, residual + x) of rows [T, N] in one kernel."""
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n), residual.reshape(-1, n)
    total, out = torch.empty_like(r2), torch.empty_like(r2)
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        _add_rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, total, out, eps, x2.stride(0), r2.stride(0),
                                             total.stride(0), out.stride(0), N=n, BLOCK=block,
                                             num_warps=min(16, max(1, block // 256)))
    return out.view(residual.shape), total.view(residual.shape)


@add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return torch.empty_like(residual), torch.empty_like(residual)


@triton.jit
def _rope_heads_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ct, stride_st,
                       NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HALF_PAD)
    mask = (heads[:, None] < NUM_HEADS) & (dims[None, :] < HALF)
    first = x_ptr + token * stride_xt + heads[:, None] * stride_xh + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + token * stride_ct + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + token * stride_st + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + token * NUM_HEADS * 2 * HALF + heads[:, None] * 2 * HALF + dims[None, :]
    tl.store(out, (x1 * c - x2 * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + HALF, (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("rill::rope_heads", mutates_args=())
def rope_heads(x: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first num_heads heads of x [T, heads, D] rotated (rotate-half), as a new [T, num_heads, D];
    cos and sin [T, 1, D/2] (or [T, D/2])."""
    num_tokens, _, head_dim = x.shape
    out = x.new_empty(num_tokens, num_heads, head_dim)
    if num_tokens:
        x = x if x.stride(-1) == 1 else x.contiguous()
        cos2, sin2 = (t.reshape(num_tokens, -1) for t in (cos, sin))
        cos2, sin2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos2, sin2))
        half = head_dim // 2
        _rope_heads_kernel[(num_tokens,)](x, cos2, sin2, out, x.stride(0), x.stride(1), cos2.stride(0),
                                          sin2.stride(0), NUM_HEADS=num_heads,
                                          HEADS_PAD=triton.next_power_of_2(num_heads), HALF=half,
                                          HALF_PAD=triton.next_power_of_2(half))
    return out


@rope_heads.register_fake
def _(x, num_heads, cos, sin):
    return x.new_empty(x.shape[0], num_heads, x.shape[2])


class TritonOps(TorchOps):
    """TorchOps with the residual add and norm, and RoPE, as one Triton kernel each (a GPU's bfloat16 or
    float16 model; rms_norm and silu_mul stay torch's, which Inductor fuses into one kernel each)."""

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.rill.add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def rope_heads(x: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return torch.ops.rill.rope_heads(x, num_heads, cos, sin)


@functools.cache
def works_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether both kernels build and agree with the twin on this device and dtype (checked once, at start:
    a Triton that cannot build them leaves the model torch's ops, with a warning, not a failed step)."""
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(3, 128, generator=gen).to(dtype) for _ in range(2))
    weight = torch.rand(128, generator=gen).to(dtype)
    angles = torch.rand(3, 1, 16, generator=gen)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    try:
        got = [*TritonOps.add_rms_norm(*to(x, residual, weight), 1e-6),
               TritonOps.rope_heads(to(x.view(3, 4, 32))[0], 3, *to(cos, sin))]
        want = [*TorchOps.add_rms_norm(x, residual, weight, 1e-6), TorchOps.rope_heads(x.view(3, 4, 32), 3, cos, sin)]
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu().float(), w.float(), atol=5e-2, rtol=5e-2)
    except Exception as exc:  # noqa: BLE001 (a compile error, a mismatch: either way torch's ops serve)
        log.warning("fused Triton norm and RoPE kernels off (%s: %s): torch's ops instead", type(exc).__name__, exc)
        return False
    return True
