"""Mamba 2's decode (Granite 4's and Nemotron-H's hybrid layers) written again for Inductor, so that the route's
compiled decode steps (decode_graphs.py) take its layers with the rest of the model (hf_linear_attention.py):
transformers' own decode, its single-token convolution update and state update (`mamba2_selective_state_update`),
with the same casts."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rill.engine_proc.model.linear_states import conv_step


def takes(layer: torch.nn.Module) -> bool:
    return type(layer).__name__ in ("GraniteMoeHybridMambaLayer", "NemotronHMamba2Mixer")


def prepare(layer: torch.nn.Module, states) -> None:
    """The layer's pools made now, as its compiled step reads them: the convolution's inputs in the model's dtype, the
    state [heads, head dim, state size] in float32, as transformers' scan leaves it."""
    states.make("conv", layer.layer_idx, (layer.conv_dim, layer.conv_kernel_size), layer.conv1d.weight.dtype)
    states.make("recurrent", layer.layer_idx, (layer.num_heads, layer.head_dim, layer.ssm_state_size), torch.float32)


def decode_step(layer: torch.nn.Module, x: torch.Tensor, conv: torch.Tensor, recurrent: torch.Tensor):
    """One token of each row: x [rows, hidden], conv [rows, channels, kernel], recurrent [rows, heads, head dim, state
    size] (float32); the output [rows, hidden] and the new states."""
    heads, head_dim, size, groups = layer.num_heads, layer.head_dim, layer.ssm_state_size, layer.n_groups
    gate, mixed, dt = layer.in_proj(x).split([layer.intermediate_size, layer.conv_dim, heads], dim=-1)
    mixed, window = conv_step(layer.conv1d, conv, mixed)
    mixed = layer.act(mixed).to(x.dtype)
    hidden, b, c = mixed.split([layer.intermediate_size, groups * size, groups * size], dim=-1)
    hidden = hidden.unflatten(-1, (heads, head_dim))
    # Each group's B and C serve heads // groups consecutive heads
    b, c = (t.unflatten(-1, (groups, size)).repeat_interleave(heads // groups, dim=1) for t in (b, c))
    dt = F.softplus(dt + layer.dt_bias.to(dt.dtype))[..., None, None]  # [rows, heads, 1, 1]
    decay = torch.exp(dt.float() * -torch.exp(layer.A_log.float())[:, None, None])
    state = recurrent * decay + (dt * b[:, :, None, :] * hidden[..., None])
    out = (state.to(c.dtype) * c[:, :, None, :]).sum(-1)  # [rows, heads, head dim]
    out = (out + hidden * layer.D[:, None]).to(out.dtype)
    out = layer.norm(out.flatten(1), gate)
    return layer.out_proj(out.to(x.dtype)), window, state
