"""Mixture-of-experts layers of transformers models (Qwen3-MoE, Mixtral, GPT-OSS, ...) on the native
model's linear kernels, for the paged transformers route on the CPU.

Transformers keeps each layer's experts as two stacked tensors and multiplies them with
torch._grouped_mm. Here each expert's two projections are packed once at load into the layers the
native model uses (oneDNN's packed bfloat16 or float32 weights, or int8 with `--quantization int8`),
and a step sorts its (token, expert) pairs by expert and runs one GEMM per expert over all of its
tokens. On the bfloat16 and int8 kernels the whole loop is one C++ operator (csrc/moe_experts.cpp)
for SiLU-gated experts (Mixtral, Qwen3-MoE) and GPT-OSS's clamped SwiGLU; the others (float32,
another gate) dispatch it from Python, one call per expert the step hits. Against the grouped GEMM,
one layer with warm weights (bench.families' shapes, bfloat16, a Zen 4:
`python -m rill.bench.kernels.moe_experts`): 4.0-6.9x faster at 16 tokens, 1.2-2.0x at 512. The
routing (the router, top-k, the weights) is still the family's own, and inside a compiled decode
step the experts are one opaque op (rill::experts), since which experts run depends on the routing.
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, _default_apply_gate

from rill.engine_proc.kernels.int8_linear import DEQUANT_CHUNK_ELEMS, Int8Linear
from rill.engine_proc.kernels.linear import AmxLinear

IMPLEMENTATION = "rill_experts"
LinearFactory = Callable[[torch.Tensor, "torch.Tensor | None", str], nn.Module]

# The packed experts modules by key: a compiled decode step (engine_proc/model/decode_graphs.py)
# calls each through the opaque op rill::experts, since the per-expert loop depends on the routing.
_packed: weakref.WeakValueDictionary[int, nn.Module] = weakref.WeakValueDictionary()
_keys = itertools.count()


def pack_experts(model: nn.Module, make_linear: LinearFactory) -> int:
    """Packs every experts module's weights into linear layers (`make_linear(weight [out, in], bias,
    name)`), drops the stacked tensors, and routes the module to rill_experts_forward; how many."""
    num_packed = 0
    for module in model.modules():
        if not _packable(module):
            continue
        for name in ("gate_up_proj", "down_proj"):
            stacked = getattr(module, name)
            biases = getattr(module, f"{name}_bias") if module.has_bias else None
            layers = [make_linear((w.t() if module.is_transposed else w).contiguous(),
                                  None if biases is None else biases[e], name) for e, w in enumerate(stacked)]
            setattr(module, f"rill_{name}", nn.ModuleList(layers))
            setattr(module, name, nn.Parameter(stacked.new_empty(0), requires_grad=False))  # its memory back
            if biases is not None:
                setattr(module, f"{name}_bias", nn.Parameter(biases.new_empty(0), requires_grad=False))
        module.config._experts_implementation = IMPLEMENTATION
        module.rill_fused = _fused_experts(module)
        module.rill_key = next(_keys)
        _packed[module.rill_key] = module
        num_packed += 1
    return num_packed


def _fused_experts(module: nn.Module) -> tuple | None:
    """The C++ operator's name (rill_cpu::moe_experts, or moe_experts_int8 for --quantization int8) and
    its arguments after the step's routing: each expert's packed (or int8 and scale) gate-and-up and
    down weights and their biases, the sizes and the gate, where the module's experts are on AmxLinear
    or the int8 kernels and gate as Mixtral and Qwen3-MoE do (SiLU, gate and up halves of one
    projection) or as GPT-OSS does (its clamped SwiGLU); else None (the Python loop: float32, any
    other gate, or a kernel that is not built)."""
    gate_up, down = module.rill_gate_up_proj, module.rill_down_proj
    layers = (*gate_up, *down)
    amx = all(isinstance(layer, AmxLinear) for layer in layers)
    int8 = all(isinstance(layer, Int8Linear) and layer.uses_kernels for layer in layers)
    if not (amx or int8):
        return None
    if (type(module)._apply_gate is _default_apply_gate and getattr(module.config, "hidden_act", None) == "silu"
            and (int8 or gate_up[0].fuses_silu_mul)):
        gate, alpha, limit = "silu", 1.0, 0.0
    elif type(module).__name__ == "GptOssExperts" and type(module)._apply_gate is _gpt_oss_gate():
        gate, alpha, limit = "clamped_swiglu", float(module.alpha), float(module.limit)
    else:
        return None
    sizes = (gate_up[0].out_features // 2, down[0].out_features, gate, alpha, limit)
    if int8:
        return ("moe_experts_int8", [layer.weight_int8 for layer in gate_up], [layer.scale for layer in gate_up],
                [layer.bias for layer in gate_up], [layer.weight_int8 for layer in down], [layer.scale for layer in down],
                [layer.bias for layer in down], *sizes, gate_up[0].gemv_max_rows(gate_up[0].float_dtype),
                DEQUANT_CHUNK_ELEMS)
    return ("moe_experts", [layer.packed_weight for layer in gate_up], [layer.bias for layer in gate_up],
            [layer.packed_weight for layer in down], [layer.bias for layer in down], *sizes)


def _gpt_oss_gate():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    return GptOssExperts._apply_gate


def _packable(module: nn.Module) -> bool:
    """An experts module of transformers' shared layout (use_experts_implementation) that gates
    (gate and up in one tensor) and has no norm after its experts."""
    return (hasattr(module, "is_concatenated") and getattr(module, "has_gate", False)
            and not getattr(module, "has_post_expert_norm", False) and not getattr(module, "_is_expert_parallel", False)
            and isinstance(getattr(module, "gate_up_proj", None), torch.Tensor) and module.gate_up_proj.dim() == 3)


def rill_experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts signature: hidden_states [T, H], each token's top_k_index and
    top_k_weights [T, k]; the weighted sum of its experts' outputs [T, H]."""
    if torch.compiler.is_compiling():
        return torch.ops.rill.experts(hidden_states, top_k_index, top_k_weights, self.rill_key)
    return _experts(self, hidden_states, top_k_index, top_k_weights)


@torch.library.custom_op("rill::experts", mutates_args=())
def _experts_op(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                key: int) -> torch.Tensor:
    return _experts(_packed[key], hidden_states, top_k_index, top_k_weights)


@_experts_op.register_fake
def _(hidden_states, top_k_index, top_k_weights, key):
    return torch.empty_like(hidden_states)


def _experts(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor) -> torch.Tensor:
    if self.rill_fused is not None and hidden_states.dtype == torch.bfloat16:
        op, *args = self.rill_fused
        return getattr(torch.ops.rill_cpu, op)(hidden_states.contiguous(), top_k_index, top_k_weights, *args)
    return _experts_loop(self, hidden_states, top_k_index, top_k_weights)


def _experts_loop(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor) -> torch.Tensor:
    num_tokens, top_k = top_k_index.shape
    order = torch.argsort(top_k_index.reshape(-1), stable=True)  # (token, expert) pairs by expert
    counts = torch.bincount(top_k_index.reshape(-1), minlength=self.num_experts).tolist()
    rows = hidden_states.index_select(0, order // top_k)
    out = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):  # one GEMM per expert hit, over all of its tokens
        if count:
            end = start + count
            gated = self._apply_gate(self.rill_gate_up_proj[expert](rows[start:end]))
            out[start:end] = self.rill_down_proj[expert](gated)
            start = end
    weighted = out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    in_token_order = torch.empty_like(weighted)
    in_token_order[order] = weighted
    # Each token's k outputs summed in its top-k order, as transformers' own implementations do.
    return in_token_order.view(num_tokens, top_k, -1).sum(dim=1).to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, rill_experts_forward)
