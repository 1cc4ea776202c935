"""The experts of a mixture-of-experts layer on the route (engine_proc/model/hf_experts.py): the
C++ operators rill_cpu::moe_experts and moe_experts_int8 against the per-expert loop they replace and
float64."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.int8_linear import Int8Linear
from rill.engine_proc.kernels.linear import AmxLinear, packed_linear
from rill.engine_proc.model import hf_experts
from tests.helpers.tiny_models import tiny_config

BF16_KERNELS = AmxLinear.applies(torch.zeros(128, 64, dtype=torch.bfloat16))
needs_bf16_kernels = pytest.mark.skipif(not BF16_KERNELS, reason="no AMX or AVX-512 BF16: the loop serves")


def experts_of(kind: str, int8: bool = False):
    """The first experts module of a tiny model of `kind` in bfloat16, with experts of 64 or 128
    (the operator's gate and up are whole 64-column panels), packed as the route packs it (`int8`:
    as --quantization int8 does); and a copy of it before packing, for the reference."""
    config = tiny_config(kind)
    for name in ("intermediate_size", "moe_intermediate_size"):
        if hasattr(config, name):
            setattr(config, name, 128 if name == "intermediate_size" else 64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().requires_grad_(False)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    model = model.to(torch.bfloat16)
    original = next(m for m in model.modules() if hasattr(m, "is_concatenated"))
    reference = copy.deepcopy(original)
    if int8:
        hf_experts.pack_experts(model, lambda weight, bias, name: Int8Linear(weight, bias))
    else:
        hf_experts.pack_experts(model, lambda weight, bias, name: packed_linear(weight, bias, name, False))
    return original, reference


def float64_experts(module, x, top_k_index, top_k_weights) -> torch.Tensor:
    """transformers' experts in float64: the stacked weights before packing, the family's own gate."""
    def project(weights, biases, e, rows):
        w = weights[e].double()
        out = rows @ w if module.is_transposed else rows @ w.t()
        return out + biases[e].double() if module.has_bias else out

    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for slot, e in enumerate(top_k_index[t].tolist()):
            gate_up = project(module.gate_up_proj, getattr(module, "gate_up_proj_bias", None), e, x[t : t + 1].double())
            gated = type(module)._apply_gate(module, gate_up)
            out[t] += project(module.down_proj, getattr(module, "down_proj_bias", None), e, gated)[0] * top_k_weights[t, slot]
    return out


def routed(packed, num_tokens: int):
    """Activations and a routing for `num_tokens` tokens: x, top_k_index, top_k_weights."""
    gen = torch.Generator().manual_seed(num_tokens)
    hidden = packed.rill_down_proj[0].out_features
    x = (torch.randn(num_tokens, hidden, generator=gen) * 3).to(torch.bfloat16)
    top_k = packed.config.num_experts_per_tok
    top_k_index = torch.stack([torch.randperm(packed.num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])
    return x, top_k_index, torch.rand(num_tokens, top_k, generator=gen).softmax(dim=-1)


@pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the kernels are not built")
@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
@pytest.mark.parametrize("num_tokens", [1, 30])
def test_the_int8_operator_is_the_int8_loop(kind, num_tokens):
    """--quantization int8: the same int8 GEMMs (the GEMV at 1 row, the converted weight at 30 rows per
    expert and more), the gate and the weighted sum in one call; the loop's answer within bfloat16's
    rounding, and about as far from float64 (int8's error dominates; at 1 token the RMS over one row is
    a single rounding's luck)."""
    packed, reference = experts_of(kind, int8=True)
    assert packed.rill_fused is not None and packed.rill_fused[0] == "moe_experts_int8"
    x, top_k_index, top_k_weights = routed(packed, num_tokens)
    fused = hf_experts._experts(packed, x, top_k_index, top_k_weights)
    loop = hf_experts._experts_loop(packed, x, top_k_index, top_k_weights)
    exact = float64_experts(reference, x, top_k_index, top_k_weights)
    assert fused.dtype == torch.bfloat16 and fused.shape == x.shape
    assert (fused.double() - loop.double()).abs().max() <= 2**-6 * loop.double().abs().max()
    err, loop_err = (fused.double() - exact).pow(2).mean().sqrt(), (loop.double() - exact).pow(2).mean().sqrt()
    assert err <= loop_err * 1.1 + 1e-6, (err.item(), loop_err.item())


@needs_bf16_kernels
@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("num_tokens", [1, 16, 70])
def test_the_operator_is_no_worse_than_the_loop(kind, num_tokens):
    """Mixtral's and Qwen3-MoE's SiLU gate, GPT-OSS's clamped SwiGLU (interleaved, with biases)."""
    packed, reference = experts_of(kind)
    assert packed.rill_fused is not None  # on AmxLinear, a gate the operator has: it serves the module
    x, top_k_index, top_k_weights = routed(packed, num_tokens)
    fused = hf_experts._experts(packed, x, top_k_index, top_k_weights)
    loop = hf_experts._experts_loop(packed, x, top_k_index, top_k_weights)
    exact = float64_experts(reference, x, top_k_index, top_k_weights)
    assert fused.dtype == torch.bfloat16 and fused.shape == x.shape
    # Root-mean-square errors: the largest single error is one rounding's luck, either way.
    err, loop_err = (fused.double() - exact).pow(2).mean().sqrt(), (loop.double() - exact).pow(2).mean().sqrt()
    assert err <= loop_err * 1.01 + 1e-6, (err.item(), loop_err.item())
    assert (fused.double() - exact).abs().max() <= 2**-6 * exact.abs().max()  # within bfloat16's rounding


@needs_bf16_kernels
def test_a_gate_the_operator_does_not_have_keeps_the_loop(monkeypatch):
    packed, _ = experts_of("qwen3_moe")
    monkeypatch.setattr(type(packed), "_apply_gate", lambda self, gate_up: gate_up[..., ::2] * gate_up[..., 1::2])
    assert hf_experts._fused_experts(packed) is None
