"""Linear-attention layers on the paged transformers route: Qwen3.5's and Qwen3-Next's Gated DeltaNet, whose layers
keep a state per sequence (a causal convolution's last inputs and a recurrent matrix) instead of keys and values.

The step's sequences go through the model as one row of tokens (hf_attention.py); such a layer would run them as one
sequence. So each of these layers runs its own transformers forward on each prompt chunk of the step alone, with that
request's states (a `RequestStates`, which answers the cache calls the layer makes as transformers' own cache does:
`cache_utils.LinearAttentionLayer`), and on the step's decodes together, their states stacked as one batch's
(`StackedStates`) and given back after. A request's states start empty at its first prompt token
(a preempted request recomputes from there) and carry over from chunk to chunk and step to step; they are kept
beside the request, and go with it. They cannot be rewound or shared, so these models are served without prefix
caching, drafts or compiled decode steps (hf_paged.py, main.py).
"""
from __future__ import annotations

import types
import weakref

import torch
import torch.nn.functional as F

from rill.engine_proc.attention.masked import start_rows
from rill.engine_proc.model.hf_attention import current_step

# Families whose linear layers this runs, by the text model's model_type (the classes' forward takes `cache`)
LINEAR_ATTENTION_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
LINEAR_LAYER_TYPE = "linear_attention"


def has_linear_attention(config) -> bool:
    return config.model_type in LINEAR_ATTENTION_MODEL_TYPES and \
        LINEAR_LAYER_TYPE in (getattr(config, "layer_types", None) or ())


class RequestStates:
    """One request's states in every linear layer, with the position each is at, as transformers' cache serves them."""

    def __init__(self) -> None:
        self.conv: dict[int, torch.Tensor] = {}
        self.recurrent: dict[int, torch.Tensor] = {}
        self.position: dict[int, int] = {}

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.conv.get(layer_idx)  # a decode step's convolution updates it in place

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.recurrent.get(layer_idx)

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        pass

    def get_recurrent_states_to_keep(self, layer_idx: int) -> int:
        return 0

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                          conv_kernel_size: int | None = None, **kwargs) -> torch.Tensor:
        """The inputs the convolution sees (the kept ones, then the new); keeps the last kernel-size of them."""
        kernel = conv_kernel_size or conv_states.shape[-1]
        previous = self.conv.get(layer_idx)
        if previous is None:
            full = F.pad(conv_states, (max(0, kernel - conv_states.shape[-1]), 0))
        else:
            full = torch.cat([previous, conv_states], dim=-1)
        self.conv[layer_idx] = full[..., -kernel:].clone()
        return full

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs) -> torch.Tensor:
        last = recurrent_states if isinstance(recurrent_states, torch.Tensor) else recurrent_states[-1]
        self.recurrent[layer_idx] = last
        return last


class LinearStates:
    """Every running request's RequestStates, kept while the request lives (a weak key: nothing to free)."""

    def __init__(self) -> None:
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def of(self, req, layer_idx: int, start: int) -> RequestStates:
        """The request's states for `layer_idx` at its position `start`: empty at 0, else where its last step left
        them (a ValueError if they are not there: a step this runner did not see)."""
        states = self._states.get(req)
        if states is None:
            states = self._states[req] = RequestStates()
        if start == 0:
            for kept in (states.conv, states.recurrent, states.position):
                kept.pop(layer_idx, None)
        elif states.position.get(layer_idx) != start:
            raise ValueError(f"request {req.req_id}: its linear-attention states are at position "
                             f"{states.position.get(layer_idx)}, not {start} (they cannot be rewound or shared)")
        return states


def install_linear_attention(model: torch.nn.Module, states: LinearStates) -> int:
    """Runs each linear-attention layer of `model` per sequence of a step (its decodes together), with each request's
    states; returns how many layers."""
    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    for layer in layers:
        layer.forward = types.MethodType(_per_sequence(type(layer).forward, states), layer)
    return len(layers)


def _per_sequence(forward, states: LinearStates):
    def run(self, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs) -> torch.Tensor:
        """A prompt chunk alone, with its request's states; the step's decodes (one token each, their states
        begun) together, their states stacked as one batch's."""
        layer, step = self.layer_idx, current_step()
        out = torch.empty_like(hidden_states)
        decodes, moved = [], []
        for seq, row in start_rows(step.batch, decodes_first=not step.backend.flat):
            num = seq.num_new_tokens
            own = states.of(seq.req, layer, seq.start_pos)
            if num == 1 and layer in own.recurrent and layer in own.conv:
                decodes.append((row, own))
            else:
                out[:, row:row + num] = forward(self, hidden_states[:, row:row + num], cache=own, attention_mask=None)
            moved.append((own, seq.start_pos + num))
        if decodes:
            rows = torch.tensor([r for r, _ in decodes], device=hidden_states.device)
            stacked = StackedStates([own for _, own in decodes], layer)
            out[0, rows] = forward(self, hidden_states[0, rows].unsqueeze(1), cache=stacked, attention_mask=None)[:, 0]
            stacked.give_back()
        for own, position in moved:
            own.position[layer] = position
        return out

    return run


class StackedStates(RequestStates):
    """Several requests' states in one layer as one batch's (a decode step's), given back to each after the call."""

    def __init__(self, owners: list[RequestStates], layer_idx: int) -> None:
        super().__init__()
        self.owners, self.layer_idx = owners, layer_idx
        self.conv[layer_idx] = torch.cat([own.conv[layer_idx] for own in owners])
        self.recurrent[layer_idx] = torch.cat([own.recurrent[layer_idx] for own in owners])

    def give_back(self) -> None:
        layer = self.layer_idx
        for i, own in enumerate(self.owners):
            own.conv[layer] = self.conv[layer][i:i + 1]
            own.recurrent[layer] = self.recurrent[layer][i:i + 1]
