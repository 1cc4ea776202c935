"""The base model's linears with LoRA deltas added per row, and the slots adapters are loaded into.

Rill fuses q, k and v into one linear and gate and up into another; PEFT's adapters target each
part. A `LoRALinear` holds every slot's adapter in one A [slots * width, in] and one B [out,
slots * width]: slot s owns columns [s * width, (s + 1) * width) of the rank dimension, where width
is the layer's parts times --max-lora-rank. In a slot, the parts' A are stacked by rows and their B
placed at their output columns, the scaling folded in; unused columns are zero. Both are kept
transposed, in float32.

A step with adapters sets `LoRAState.masks`: per width, [rows, slots * width], 1 where a row's own
slot's columns lie. The delta is then `((x A^T) * mask) B^T` over all rows at once: three ops a
layer whatever the mix of adapters (measured on 2 cores, 32 rows, 3 adapters: 69 µs a layer
against 184 for gathering each adapter's rows and adding them back). A step without adapters sets
no mask, and its layers are their base linears alone (which the compiled decode graph holds).
"""
from __future__ import annotations

import itertools
import re

import torch
from torch import nn

from rill.engine_proc.lora.adapter import ATTENTION, MLP, LoRAAdapter, module_shapes

# A linear of transformers' own decoder layer, by its module path (the paged transformers route)
_HF_LINEAR = re.compile(rf"layers\.(\d+)\.(?:self_attn|mlp)\.({'|'.join(ATTENTION + MLP)})$")


class LoRAState:
    """The step's row masks by width (empty: no adapter in the step), shared by every LoRALinear."""

    def __init__(self) -> None:
        self.masks: dict[int, torch.Tensor] = {}


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, layer: int, in_features: int, parts: list[tuple[str, int, int]],
                 state: LoRAState, max_loras: int, max_rank: int, device) -> None:
        """`parts`: (PEFT module name, first output column, columns) of each part of this layer."""
        super().__init__()
        self.base = base
        self.layer = layer
        self.parts = parts
        self.state = state
        self.width = len(parts) * max_rank
        out_features = sum(size for _, _, size in parts)
        # Transposed and in float32: at one row (a decode at concurrency 1) a bfloat16 matmul of these
        # shapes took 57 µs against 18 in float32, and at 32 rows 70 against 72 (2 cores).
        self.at = torch.zeros(in_features, max_loras * self.width, device=device)
        self.bt = torch.zeros(max_loras * self.width, out_features, device=device)

    def set_slot(self, slot: int, adapter: LoRAAdapter | None) -> None:
        columns = slice(slot * self.width, (slot + 1) * self.width)
        self.at[:, columns] = 0
        self.bt[columns] = 0
        if adapter is None:
            return
        row = slot * self.width
        for name, start, size in self.parts:
            pair = adapter.weights.get((self.layer, name))
            if pair is None:
                continue
            a, b = pair
            self.at[:, row : row + a.shape[0]] = a.t()
            self.bt[row : row + a.shape[0], start : start + size] = b.t()
            row += a.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.state.masks:
            y = y + (((x.float() @ self.at) * self.state.masks[self.width]) @ self.bt).to(y.dtype)
        return y


def wrap_linears(model: nn.Module, state: LoRAState, max_loras: int, max_rank: int, device) -> list[LoRALinear]:
    """Replaces the attention and MLP linears of every layer by LoRALinears; returns them."""
    shapes = module_shapes(model.config)  # PEFT module name -> (in_features, out_features)

    def parts_of(names):  # (name, first output column, columns) of the parts fused in one linear
        starts = itertools.accumulate((shapes[n][1] for n in names), initial=0)
        return [(n, start, shapes[n][1]) for n, start in zip(names, starts)]

    fused = [("attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")), ("attn", "o_proj", ("o_proj",)),
             ("mlp", "gate_up_proj", ("gate_proj", "up_proj")), ("mlp", "down_proj", ("down_proj",))]
    wrapped = []
    model.all_rows_to_the_end = True  # the row masks cover every token of the step
    for i, layer in enumerate(model.layers):
        for parent_name, attr, names in fused:
            parent = getattr(layer, parent_name)
            module = LoRALinear(getattr(parent, attr), i, shapes[names[0]][0], parts_of(names), state, max_loras,
                                max_rank, device)
            setattr(parent, attr, module)
            wrapped.append(module)
    model.bind_kernels()  # the wrapped layers: no fused epilogues, none takes the prefill operator
    return wrapped


def wrap_transformers_linears(model: nn.Module, state: LoRAState, max_loras: int, max_rank: int,
                              device) -> list[LoRALinear]:
    """transformers' own model (the paged route): each of a decoder layer's `self_attn` and `mlp` linears that PEFT
    names (q_proj ... down_proj) becomes a LoRALinear of one part. A mixture of experts' MLP has none (its experts
    are not targetable): an adapter of those is refused at load (LoRAManager.load)."""
    shapes = module_shapes(model.config.get_text_config())
    wrapped = []
    for path, module in list(model.named_modules()):
        match = _HF_LINEAR.search(path)
        if match is None:
            continue
        layer, name = int(match.group(1)), match.group(2)
        parent_path, _, attr = path.rpartition(".")
        wrapper = LoRALinear(module, layer, shapes[name][0], [(name, 0, shapes[name][1])], state, max_loras, max_rank,
                             device)
        setattr(model.get_submodule(parent_path), attr, wrapper)
        wrapped.append(wrapper)
    return wrapped
