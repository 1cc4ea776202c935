"""Mixture-of-experts layers of transformers models (Qwen3-MoE, Mixtral, GPT-OSS, ...) on the native
model's linear kernels, for the paged transformers route on the CPU.

Transformers keeps each layer's experts as two stacked tensors and multiplies them with
torch._grouped_mm. Here each expert's two projections are packed once at load into the layers the
native model uses (oneDNN's packed bfloat16 or float32 weights, or int8 with `--quantization int8`),
and a step sorts its (token, expert) pairs by expert and runs one GEMM per expert over all of its
tokens: 1.4-2.2x faster than the grouped GEMM at 16 tokens a step, 1.1-1.2x at 512, with the same
results (bench.families' shapes of Qwen3-MoE, Mixtral and GPT-OSS, bfloat16, a Zen 4:
`python -m rill.bench.kernels.moe_experts`). The GEMMs are dispatched from Python, one call per
expert the step hits; one grouped kernel in C++ is not built. The routing (the router,
top-k, the weights) and the gate between the projections are still the family's own.
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

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
        module.rill_key = next(_keys)
        _packed[module.rill_key] = module
        num_packed += 1
    return num_packed


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
