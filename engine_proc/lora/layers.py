"""The base model's linears with LoRA deltas added per row, and the slots adapters are loaded into.

Rill fuses q, k and v into one linear and gate and up into another; PEFT's adapters target each
part. A `LoRALinear` holds, per slot, one A [r_total, in] and one B [out, r_total] for the whole
fused layer: the parts' A stacked by rows, their B placed block-diagonally at their columns, so a
fused layer's delta is still two matmuls. A step sets `LoRAState.groups`: for each adapter in the
step, its slot and the token rows that use it. Rows of the base model pay nothing; with no
adapter in the step the layer is its base linear alone (which the compiled decode graph holds).
"""
from __future__ import annotations

import torch
from torch import nn

from engine_proc.lora.adapter import LoRAAdapter


class LoRAState:
    """The step's (slot, token rows) pairs, shared by every LoRALinear of the model."""

    def __init__(self) -> None:
        self.groups: list[tuple[int, torch.Tensor]] = []


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, layer: int, parts: list[tuple[str, int, int]], state: LoRAState,
                 max_loras: int) -> None:
        """`parts`: (PEFT module name, first output column, columns) of each part of this layer."""
        super().__init__()
        self.base = base
        self.layer = layer
        self.parts = parts
        self.state = state
        self.out_features = sum(size for _, _, size in parts)
        self.a: list[torch.Tensor | None] = [None] * max_loras
        self.b: list[torch.Tensor | None] = [None] * max_loras

    def set_slot(self, slot: int, adapter: LoRAAdapter | None, dtype: torch.dtype, device) -> None:
        pairs = [(adapter.weights.get((self.layer, name)), start, size) for name, start, size in self.parts] \
            if adapter is not None else []
        pairs = [(w, start, size) for w, start, size in pairs if w is not None]
        if not pairs:
            self.a[slot] = self.b[slot] = None
            return
        a = torch.cat([w[0] for w, _, _ in pairs])
        b = torch.zeros(self.out_features, a.shape[0])
        row = 0
        for (wa, wb), start, size in pairs:
            b[start : start + size, row : row + wa.shape[0]] = wb
            row += wa.shape[0]
        self.a[slot], self.b[slot] = a.to(device, dtype), b.to(device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        for slot, rows in self.state.groups:
            a = self.a[slot]
            if a is not None:
                y.index_add_(0, rows, (x.index_select(0, rows) @ a.t()) @ self.b[slot].t())
        return y


def wrap_linears(model: nn.Module, state: LoRAState, max_loras: int) -> list[LoRALinear]:
    """Replaces the attention and MLP linears of every layer by LoRALinears; returns them."""
    config = model.config
    head_dim = model.layers[0].attn.head_dim
    q_out = config.num_attention_heads * head_dim
    kv_out = model.layers[0].attn.num_kv_heads * head_dim
    inter = config.intermediate_size
    wrapped = []
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.attn, layer.mlp
        for parent, attr, parts in [
            (attn, "qkv_proj", [("q_proj", 0, q_out), ("k_proj", q_out, kv_out), ("v_proj", q_out + kv_out, kv_out)]),
            (attn, "o_proj", [("o_proj", 0, config.hidden_size)]),
            (mlp, "gate_up_proj", [("gate_proj", 0, inter), ("up_proj", inter, inter)]),
            (mlp, "down_proj", [("down_proj", 0, config.hidden_size)]),
        ]:
            module = LoRALinear(getattr(parent, attr), i, parts, state, max_loras)
            setattr(parent, attr, module)
            wrapped.append(module)
    return wrapped
