"""The paged KV cache's layout: each layer's K/V shape, which layers keep K/V of their own, and how many blocks of
them fit in memory (kv_cache.py allocates them)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rill.engine_proc.attention import kv_int8

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def head_dim_of(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def num_kv_heads_of(config: PretrainedConfig) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


# Layers with no K/V (engine_proc/model/hf_linear_attention.py): transformers' names for those keeping a state per
# sequence (linear attention and Mamba's "linear_attention", LFM2's short convolutions), and for Nemotron-H's layers
# of an MLP or experts alone
STATE_LAYER_TYPES = ("linear_attention", "conv")
STATELESS_LAYER_TYPES = ("mlp", "moe")
NO_KV_LAYER_TYPES = (*STATE_LAYER_TYPES, *STATELESS_LAYER_TYPES)


def layer_kv_shapes(config: PretrainedConfig) -> list[tuple[int, int]]:
    """Each layer's (num_kv_heads, head_dim): the config's own, or each layer's in a heterogeneous config
    (transformers' per_layer_config: Gemma 4's global layers have wider heads, maybe fewer, than its sliding ones).
    Multi-head latent attention (DeepSeek V2 and V3, GLM-4.7-Flash) caches every query head's expanded keys, and its
    values padded to their width (hf_attention.py)."""
    if getattr(config, "qk_nope_head_dim", None) and getattr(config, "v_head_dim", None):
        key_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        return [(config.num_attention_heads, max(key_dim, config.v_head_dim))] * config.num_hidden_layers
    if not getattr(config, "is_heterogeneous", False):
        return [(num_kv_heads_of(config), head_dim_of(config))] * config.num_hidden_layers
    layers = [config.per_layer_config[i] for i in range(config.num_hidden_layers)]
    return [(num_kv_heads_of(layer), head_dim_of(layer)) for layer in layers]


def kv_sources(config: PretrainedConfig) -> list[int]:
    """Each layer's K/V: its own (its index), or, for a layer that reuses another's (transformers' kv_sharing_modes
    "reuse": Gemma 4's and Gemma 3n's last layers), the layer of its type that keeps them for it ("store"); a
    layer without attention (a state layer's, an MLP's alone), which has none, a full layer's tensor it never
    touches."""
    num_layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None) or ()
    if set(types) & set(NO_KV_LAYER_TYPES):  # they hold a full layer's tensor, unused
        first = types.index("full_attention") if "full_attention" in types else 0
        return [first if kind in NO_KV_LAYER_TYPES else i for i, kind in enumerate(types)]
    modes = getattr(config, "kv_sharing_modes", None) if getattr(config, "num_kv_shared_layers", 0) else None
    if not modes:
        return list(range(num_layers))
    keeper = {types[i]: i for i in range(num_layers) if modes[i] == "store"}
    if any(modes[i] == "reuse" and types[i] not in keeper for i in range(num_layers)):
        return list(range(num_layers))  # no layer of its own keeps them (a draft model's): each its own
    return [keeper[types[i]] if modes[i] == "reuse" else i for i in range(num_layers)]


def bytes_per_block(config: PretrainedConfig, dtype: torch.dtype, block_size: int, num_layers: int | None = None,
                    kv_cache_dtype: str = "auto") -> int:
    """K and V of `block_size` tokens across the layers that keep their own (kv_sources), or `num_layers` block
    tensors, which window tables share (layers of one shape); with --kv-cache-dtype int8 a row is head_dim bytes and
    its scale (kv_int8.py), not head_dim of `dtype`."""
    shapes = layer_kv_shapes(config)
    shapes = shapes[:num_layers] if num_layers is not None else [shapes[i] for i in sorted(set(kv_sources(config)))]
    return sum(2 * block_size * num_kv_heads * (kv_int8.row_bytes(head_dim) if kv_cache_dtype == "int8"
                                                else head_dim * dtype.itemsize) for num_kv_heads, head_dim in shapes)


def num_blocks_for_memory(
    config: PretrainedConfig, dtype: torch.dtype, block_size: int, memory_bytes: int, num_layers: int | None = None,
    kv_cache_dtype: str = "auto",
) -> int:
    """Blocks that fit: of every layer, or of `num_layers` block tensors (a model with window tables,
    engine_proc/sched/window_tables.py, has as many as global layers)."""
    return max(0, int(memory_bytes) // bytes_per_block(config, dtype, block_size, num_layers, kv_cache_dtype))
