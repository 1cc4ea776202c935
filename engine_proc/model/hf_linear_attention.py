"""Layers that keep a state per sequence instead of keys and values on the paged transformers route: Qwen3.5's and
Qwen3-Next's Gated DeltaNet, Granite 4's Mamba 2 (a causal convolution's last inputs and a recurrent state), their
states in pools of slots (linear_states.py).

The step's sequences go through the model as one row of tokens (hf_attention.py); such a layer would run them as one
sequence. So each of these layers runs its own transformers forward on each prompt chunk of the step alone, over its
request's slot, and on the step's decodes together, their states gathered from the pools as one batch's and scattered
back after. Gated DeltaNet's and Mamba 2's decodes are written again for Inductor (gated_deltanet.py, mamba2.py):
the compiled decode steps (decode_graphs.py) trace them with the rest of the model, the slots and pools their inputs;
a model with other state layers decodes eagerly. A state cannot be rewound or shared, so these models are served without prefix caching or
drafts (hf_paged.py, main.py).
"""
from __future__ import annotations

import inspect
import types

import torch

from rill.engine_proc.attention.kv_layout import STATE_LAYER_TYPES
from rill.engine_proc.attention.masked import start_rows
from rill.engine_proc.model import gated_deltanet, mamba2
from rill.engine_proc.model.hf_attention import current_step
from rill.engine_proc.model.linear_states import LinearStates

# Families whose state layers this runs, by the text model's model_type: each checked against transformers' logits
# (tests/model/test_transformers_route.py): their attention layers through transformers' attention interface, their
# state layers through transformers' cache calls, one state of each kind a layer
LINEAR_ATTENTION_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "granitemoehybrid", "nemotron_h",
                                "lfm2", "lfm2_moe")
DECODE_STEPS = (gated_deltanet, mamba2)  # the layers whose decode is written for Inductor: takes, prepare, decode_step


def has_linear_attention(config) -> bool:
    return config.model_type in LINEAR_ATTENTION_MODEL_TYPES and \
        bool(set(STATE_LAYER_TYPES) & set(getattr(config, "layer_types", None) or ()))


def state_layers(model: torch.nn.Module, config) -> list[torch.nn.Module]:
    """The modules of `model` that keep its linear layers' states: each indexed by its layer, taking transformers'
    `cache` (not the decoder layer around it, nor an attention)."""
    linear = {i for i, kind in enumerate(config.layer_types) if kind in STATE_LAYER_TYPES}
    found = [m for m in model.modules() if getattr(m, "layer_idx", None) in linear
             and not type(m).__name__.endswith(("DecoderLayer", "Attention"))
             and "cache" in inspect.signature(type(m).forward).parameters]
    ids = {id(m) for m in found}  # the innermost (Nemotron-H's mixer, not the block around it)
    return [m for m in found if not any(id(sub) in ids for sub in list(m.modules())[1:])]


def install_linear_attention(model: torch.nn.Module, layers: list[torch.nn.Module],
                             device: torch.device) -> LinearStates:
    """Runs each of `layers` per sequence of a step (its decodes together) over the states' pools."""
    states = LinearStates(device)
    kinds = [next((kind for kind in DECODE_STEPS if kind.takes(layer)), None) for layer in layers]
    states.compiled = None not in kinds  # a decode step for each: compiled steps
    for layer, kind in zip(layers, kinds):
        if states.compiled:
            kind.prepare(layer, states)
            layer.rill_decode_step = kind.decode_step
        layer.forward = types.MethodType(_per_sequence(type(layer).forward, states), layer)
    return states


def decode_rows(layer: torch.nn.Module, hidden_states: torch.Tensor, slots: torch.Tensor,
                pools: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[rows, hidden]: one token each of the sequences in `slots` through a layer with a decode step written for
    Inductor (DECODE_STEPS), their states gathered from the pools, advanced one token, scattered back."""
    conv_pool, recurrent_pool = pools
    # A compiled step's rows: two unknown sizes, one number, not 0 (Qwen3-Next's reshapes divide by it)
    torch._check(slots.shape[0] == hidden_states.shape[0])
    torch._check(hidden_states.shape[0] > 0)
    out, conv, recurrent = layer.rill_decode_step(
        layer, hidden_states, conv_pool.index_select(0, slots),
        None if recurrent_pool is None else recurrent_pool.index_select(0, slots))
    conv_pool.index_copy_(0, slots, conv)
    if recurrent_pool is not None:
        recurrent_pool.index_copy_(0, slots, recurrent)
    return out


def _per_sequence(forward, states: LinearStates):
    def run(self, hidden_states: torch.Tensor, cache=None, attention_mask=None, rill_graph=None,
            **kwargs) -> torch.Tensor:
        """A compiled decode step's rows together (its metadata names their slots); in an eager step a prompt
        chunk alone over its request's slot, the decodes (one token each) together."""
        layer = self.layer_idx
        if rill_graph is not None:
            pools = (rill_graph.linear_conv[layer], rill_graph.linear_recurrent[layer])
            return decode_rows(self, hidden_states[0], rill_graph.linear_slots, pools).unsqueeze(0)
        step = current_step()
        out = torch.empty_like(hidden_states)
        rows, slots = [], []
        for seq, row in start_rows(step.batch, decodes_first=not step.backend.flat):
            num, slot = seq.num_new_tokens, states.slot(seq.req)
            if num == 1 and layer in states.conv:  # (a layer's very first token makes its pools, as a prompt's)
                rows.append(row)
                slots.append(slot)
            else:
                own = states.of_slot(layer, slot)
                out[:, row:row + num] = forward(self, hidden_states[:, row:row + num], cache=own, attention_mask=None)
        if rows:
            device = hidden_states.device
            rows_at, slots_at = (torch.tensor(v, device=device) for v in (rows, slots))
            if states.compiled:
                pools = (states.conv[layer], states.recurrent.get(layer))
                out[0, rows_at] = decode_rows(self, hidden_states[0, rows_at], slots_at, pools)
            else:  # transformers' own decode, the rows as a batch
                gathered = states.gather(layer, slots_at)
                out[0, rows_at] = forward(self, hidden_states[0, rows_at].unsqueeze(1), cache=gathered,
                                          attention_mask=None)[:, 0]
                states.scatter(layer, slots_at, gathered)
        return out

    return run
