"""The opaque attention ops compiled steps call (torch.library custom ops): the compiled graph sees
neither the context length nor the KV cache, which the ops read and write by layer index."""
from __future__ import annotations

import torch

from rill.engine_proc.attention.kv_cache import additive_mask, decode_attention, write_kv

# The KV cache of each layer for the ops below (bind_kv_caches). The op reads and
# writes it by layer index instead of taking it as an argument, as vLLM's attention op does: a cache
# passed in and declared mutated is functionalized by torch.compile, which copied the whole cache
# every step. The op's writes are its own layer's slots, which nothing else in the graph reads.
_kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []


def bind_kv_caches(kv_cache) -> None:
    _kv_caches[:] = list(zip(kv_cache.k_caches, kv_cache.v_caches))


@torch.library.custom_op("rill::paged_decode_attention", mutates_args=())
def paged_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    layer: int,
) -> torch.Tensor:
    """Writes the step's K/V at their slots of layer `layer`'s cache, then one query token per
    row [B, H, D] against its sequence's cached context: keys 0..context_lens[b]-1, in the
    blocks of `block_table` [B, num_blocks]: on a GPU the Triton kernels (triton_decode.py), on the CPU the torch path
    with an additive mask (the "cpu" backend's graphs call the C++ operator rill_cpu::paged_decode_layer
    instead)."""
    k_cache, v_cache = _kv_caches[layer]
    if q.is_cuda:  # two kernels: every row's K/V written, then each row's blocks read up to its length
        from rill.engine_proc.attention.triton_decode import decode_attention_triton, write_kv_triton

        write_kv_triton(k_cache, v_cache, k, v, slot_mapping)
        return decode_attention_triton(q, k_cache, v_cache, block_table, context_lens, q.shape[-1] ** -0.5)
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    return decode_attention(q, k_cache, v_cache, block_table, additive_mask(context_lens, block_table, k_cache))


@paged_decode_attention.register_fake
def _(q, k, v, slot_mapping, block_table, context_lens, layer):
    return torch.empty_like(q)


@torch.library.custom_op("rill::paged_prefill_attention", mutates_args=())
def paged_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_of_token: torch.Tensor,
    context_lens: torch.Tensor,
    tile_lens: torch.Tensor,
    layer: int,
) -> torch.Tensor:
    """A step of any tokens, prompts and decodes, as the Triton backend lays it out (prepare_flat_step):
    writes their K/V at their slots of layer `layer`'s cache, then each token attends to positions
    [0, context_lens[t]) of its sequence (Triton, through the tiles of `tile_lens`)."""
    from rill.engine_proc.attention.triton import paged_attention_triton

    k_cache, v_cache = _kv_caches[layer]
    if q.is_cuda:
        from rill.engine_proc.attention.triton_decode import write_kv_triton

        write_kv_triton(k_cache, v_cache, k, v, slot_mapping)
    else:  # Triton's interpreter, for tests
        write_kv(k_cache, v_cache, k, v, slot_mapping)
    return paged_attention_triton(q, k_cache, v_cache, block_tables, seq_of_token, context_lens,
                                  q.shape[-1] ** -0.5, tile_lens)


@paged_prefill_attention.register_fake
def _(q, k, v, slot_mapping, block_tables, seq_of_token, context_lens, tile_lens, layer):
    return torch.empty_like(q)
