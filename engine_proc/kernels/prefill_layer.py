"""Prompt steps' decoder layers as one C++ operator each (rill_cpu::prefill_layer, csrc/prefill_layer.cpp).

A 512-token prefill of the bundled model spent about 5 ms of its ~90 in Python between a layer's
nine kernel calls, the second core idle meanwhile. Where a step is fresh prompts only and every
layer runs on the AMX path, each layer is one call with the same kernels in the same order (the
same bits); anything else takes DecoderLayer.forward.
"""
from __future__ import annotations

import torch

from rill.engine_proc.attention.kv_cache import AttentionMetadata
from rill.engine_proc.kernels.linear import AmxLinear


def layer_args(layer) -> tuple | None:
    """(weights, biases, out_features) of a layer the operator can run, else None."""
    attn, mlp = layer.attn, layer.mlp
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    if (attn.q_norm is not None or attn.head_dim != 64
            or not all(isinstance(lin, AmxLinear) and not lin.fixed_tiles for lin in linears)
            or not (attn.qkv_proj.fuses_rope and mlp.gate_up_proj.fuses_silu_mul)):
        return None
    weights = [layer.input_norm.weight, attn.qkv_proj.packed_weight, attn.o_proj.packed_weight,
               layer.post_attn_norm.weight, mlp.gate_up_proj.packed_weight, mlp.down_proj.packed_weight]
    return weights, [lin.bias for lin in linears], [lin.out_features for lin in linears]


def step_bounds(meta: AttentionMetadata) -> list[int] | None:
    """The prompts' first rows and the token count, where the step is fresh prompts only (each
    attends to its own tokens); the backend (attention/cpu.py) offers the operator only in bfloat16
    on a CPU with the prompt kernel."""
    if meta.num_decode_tokens or not meta.prefills or any(chunk.block_table is not None for chunk in meta.prefills):
        return None
    return [chunk.token_start for chunk in meta.prefills] + [meta.prefills[-1].token_end]


def run(model, h, rope: list, meta: AttentionMetadata, kv_cache, bounds: list[int], last_rows) -> tuple | None:
    """(hidden, residual) after every layer through the operator, or None where a layer cannot take it
    (then nothing has run). `rope`: each layer's (cos, sin); `last_rows`: the rows the last layer keeps
    past its K/V writes (or None)."""
    if model.prefill_layer_args is None:  # built once: the layers' modules do not change after loading
        model.prefill_layer_args = [layer_args(layer) for layer in model.layers]
    args = model.prefill_layer_args
    if model.shard is not None or any(a is None for a in args):
        return None
    op, first = torch.ops.rill_cpu.prefill_layer, model.layers[0]
    eps, num_heads, num_kv_heads = first.input_norm.eps, first.attn.num_heads, first.attn.num_kv_heads
    residual, last = None, len(args) - 1
    for i, ((weights, biases, outs), (cos, sin), k_cache, v_cache) in enumerate(
            zip(args, rope, kv_cache.k_caches, kv_cache.v_caches)):
        h, residual = op(h, residual, weights, biases, outs, eps, cos, sin, num_heads, num_kv_heads, k_cache, v_cache,
                         meta.slot_mapping, bounds, last_rows if i == last else None)
    return h, residual
