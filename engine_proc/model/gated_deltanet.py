"""Gated DeltaNet's decode (Qwen3.5, Qwen3-Next) written again for Inductor, so that the route's compiled decode steps
(decode_graphs.py) take its layers with the rest of the model (hf_linear_attention.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from rill.engine_proc.model.linear_states import conv_step


def takes(layer: torch.nn.Module) -> bool:
    return type(layer).__name__.endswith("GatedDeltaNet")


def prepare(layer: torch.nn.Module, states) -> None:
    """The layer's pools made now, as its compiled step reads them; Qwen3.5's b and a in one projection for
    decode_step (a copy: they are small)."""
    states.make("conv", layer.layer_idx, (layer.conv_dim, layer.conv_kernel_size), layer.conv1d.weight.dtype)
    states.make("recurrent", layer.layer_idx, (layer.num_v_heads, layer.head_k_dim, layer.head_v_dim), torch.float32)
    if hasattr(layer, "in_proj_b"):
        ba = torch.cat([layer.in_proj_b.weight, layer.in_proj_a.weight])
        layer.rill_in_proj_ba = torch.nn.Linear(ba.shape[1], ba.shape[0], bias=False, device=ba.device,
                                                dtype=ba.dtype).requires_grad_(False)
        layer.rill_in_proj_ba.weight.copy_(ba)


def decode_step(layer: torch.nn.Module, x: torch.Tensor, conv: torch.Tensor, recurrent: torch.Tensor):
    """A Gated DeltaNet layer's forward for one token of each row, as transformers' own decode (its single-token
    convolution update and recurrent rule), written for Inductor: the reshapes of transformers' forward over a
    compiled step's unknown number of rows made Inductor assume it was one. Qwen3.5's b and a come from one
    projection (prepare): in float32 `a + dt_bias` on a projection's own output matched oneDNN
    fusion patterns that take only Inductor's packed weights and sizes it knows. x [rows, hidden], conv [rows, channels,
    kernel], recurrent [rows, heads, key dim, value dim] (float32): the output [rows, hidden] and the new states."""
    key_heads, value_heads = layer.num_k_heads, layer.num_v_heads
    if hasattr(layer, "in_proj_qkvz"):  # Qwen3-Next: q, k, v, z and b, a interleaved by key head
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x[:, None]), layer.in_proj_ba(x[:, None]))
        mixed = torch.cat([t.flatten(2) for t in (q, k, v)], dim=-1)[:, 0]
        z, b, a = z[:, 0].flatten(1), b[:, 0], a[:, 0]
    else:
        mixed, z = layer.in_proj_qkv(x), layer.in_proj_z(x)
        b, a = layer.rill_in_proj_ba(x).split(value_heads, dim=-1)
    mixed, window = conv_step(layer.conv1d, conv, mixed)
    mixed = ACT2FN[layer.activation](mixed).to(x.dtype)
    q, k, v = mixed.split([layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    q, k = (t.unflatten(-1, (key_heads, layer.head_k_dim)).float() for t in (q, k))
    v = v.unflatten(-1, (value_heads, layer.head_v_dim)).float()
    if value_heads != key_heads:
        q, k = (t.repeat_interleave(value_heads // key_heads, dim=1) for t in (q, k))
    q = _l2norm(q) / layer.head_k_dim**0.5
    k = _l2norm(k)
    beta = b.sigmoid().float()[..., None]
    decay = (-layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)).exp()
    state = recurrent * decay[..., None, None]
    delta = (v - (state * k[..., None]).sum(-2)) * beta
    state = state + k[..., None] * delta[..., None, :]
    out = (state * q[..., None]).sum(-2).to(x.dtype)
    out = layer.norm(out, z.unflatten(-1, (value_heads, layer.head_v_dim)))  # over the last dimension alone
    return layer.out_proj(out.flatten(1)), window, state


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)  # transformers' (FLA's) l2norm
