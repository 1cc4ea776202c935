"""The paged KV cache: block tensors (their layout and count: kv_layout.py), slot writes, attention over it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rill.engine_proc.attention import kv_int8
from rill.engine_proc.attention.kv_layout import kv_sources, layer_kv_shapes
from rill.engine_proc.model.memory import resident_zeros
from rill.engine_proc.sched.window_tables import layer_groups

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class KVCache:
    """K and V of every layer as [num_blocks, block_size, num_kv_heads, head_dim] tensors.

    Token at position p of a request lives in slot block_ids[p // block_size] * block_size
    + p % block_size; the block manager owns which block ids a request holds.

    `window_layers`: a model's sliding layers, when it has global ones too: the cache is then as
    many tensors as global layers, each shared by one global layer and a layer of each sliding group,
    which address it through their group's block table (engine_proc/sched/window_tables.py).

    `kv_cache_dtype` "int8": each tensor int8 [num_blocks, block_size, num_kv_heads, head_dim + 4], a
    row's scale in its last 4 bytes (kv_int8.py), so `_storage[:, :, block]` is still a whole block,
    scales included, for whatever reads or writes blocks whole (a block saved from one kind of cache is
    not another's: keep `kv_cache_dtype` with it); "auto": `dtype`.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        window_layers: tuple[int, ...] = (),
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shapes = layer_kv_shapes(config)
        self.num_kv_heads, self.head_dim = shapes[0]
        num_layers = config.num_hidden_layers
        if window_layers and len(set(shapes)) > 1:
            raise ValueError("window tables share block tensors between layers: they need one K/V shape")
        # Each layer's (group, tensor): group 0 the global layers, 1.. the sliding layers' groups. Without window
        # tables, a layer that reuses another's K/V (kv_sources) has that layer's tensor: both write the same K/V.
        if window_layers:
            self.num_window_groups, self.layer_places = layer_groups(window_layers, num_layers)
        else:
            sources = kv_sources(config)
            slot_of = {owner: slot for slot, owner in enumerate(sorted(set(sources)))}
            self.num_window_groups, self.layer_places = 0, [(0, slot_of[sources[layer]]) for layer in range(num_layers)]
        num_tensors = 1 + max(slot for _, slot in self.layer_places)
        self.kv_cache_dtype = kv_cache_dtype
        dtype = torch.int8 if kv_cache_dtype == "int8" else dtype

        def zeros(count: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
            row = kv_int8.row_bytes(head_dim) if kv_cache_dtype == "int8" else head_dim
            # Zeros, not empty: attention reads whole blocks and masks the unused slots, and
            # a masked NaN left in uninitialised memory would still poison the weighted sum.
            return resident_zeros((count, 2, num_blocks, block_size, num_kv_heads, row), dtype, device)

        if len(set(shapes)) == 1:
            self._storages = [zeros(num_tensors, *shapes[0])]
            tensors = [self._storages[0][slot] for _, slot in self.layer_places]
        else:  # layers of several shapes: a tensor of each one's shape
            owners: dict[int, int] = {}  # each tensor's first layer, whose shape it takes
            for layer, (_, slot) in enumerate(self.layer_places):
                owners.setdefault(slot, layer)
            self._storages = [zeros(1, *shapes[owners[slot]]) for slot in range(num_tensors)]
            tensors = [self._storages[slot][0] for _, slot in self.layer_places]
        self.k_caches = [t[0] for t in tensors]
        self.v_caches = [t[1] for t in tensors]

    @property
    def num_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self._storages)

    @property
    def _storage(self) -> torch.Tensor:
        if len(self._storages) > 1:
            raise ValueError("the disk tier of the KV cache needs layers of one K/V shape (not Gemma 4's)")
        return self._storages[0]

    def read_blocks(self, block_ids: torch.Tensor) -> torch.Tensor:
        """A copy of these blocks, whole in every tensor ([num_tensors, 2, len(block_ids), ...]): the disk tier's
        spill (engine_proc/kv_disk/)."""
        return self._storage.index_select(2, block_ids)

    def write_blocks(self, block_ids: torch.Tensor, blocks: torch.Tensor) -> None:
        """Puts back blocks as read_blocks() copied them: the disk tier's reload."""
        self._storage.index_copy_(2, block_ids, blocks)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store the step's new K/V ([num_tokens, num_kv_heads, head_dim]) at their slots (the torch
    twin of engine_proc/attention/cpu.py's write_kv)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_blocks(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Cached K or V of block-id rows [S, num_blocks], as [S, num_blocks * block_size, H, D]."""
    num_seqs, num_blocks = block_table.shape
    # index_select on the flat ids: much faster on CPU than advanced indexing cache[table].
    gathered = cache.index_select(0, block_table.reshape(-1))
    return gathered.view(num_seqs, num_blocks * cache.shape[1], *cache.shape[2:])


@dataclass
class PrefillChunk:
    """One sequence's multi-token slice in the step, and what its queries may attend to."""

    token_start: int  # where its tokens lie in the step's flattened tokens
    token_end: int
    start_pos: int = 0  # the position of its first token
    # None when the chunk starts at position 0: it attends to its own new K/V only.
    block_table: torch.Tensor | None = None  # [num_blocks] covering [0, context_len)
    context_len: int = 0
    causal_mask: torch.Tensor | None = None  # [num_new_tokens, context_len], True = attend


@dataclass
class AttentionMetadata:
    """Index tensors for one step, built once and shared by every layer.

    Decode tokens (one per sequence) come first in the flattened step, then prefill chunks.
    """

    slot_mapping: torch.Tensor  # [num_tokens]: where each new token's K/V goes
    num_decode_tokens: int = 0
    decode_block_table: torch.Tensor | None = None  # [num_decodes, max_num_blocks]
    decode_context_len: int = 0  # the longest decode context
    decode_mask: torch.Tensor | None = None  # [num_decodes, 1, 1, decode_context_len]; None = all full
    decode_lens: torch.Tensor | None = None  # [num_decodes] int64: each row's context length (position + 1)
    prefills: list[PrefillChunk] = field(default_factory=list)
    # Every token a row of its own (engine_proc/model/step_inputs.py prepare_flat_step): the Triton
    # kernel's view, and the batch-invariant CPU backend's, which also sets the per-token
    # decode_block_table and decode_lens (engine_proc/attention/cpu.py).
    block_tables: torch.Tensor | None = None  # [num_seqs, max_num_blocks] int32
    seq_of_token: torch.Tensor | None = None  # [num_tokens] int32: each token's row of block_tables
    context_lens: torch.Tensor | None = None  # [num_tokens] int32: position + 1
    # (tokens per tile, [num_tokens] int32): the Triton kernel's tiles, worked out by the first layer
    tile_lens: tuple[int, torch.Tensor] | None = None


@dataclass
class GraphDecodeMetadata:
    """A compiled decode step's (engine_proc/model/decode_graphs.py): one query row per token, whose
    K/V one opaque op writes and attends (the backend's graph_decode_op), so the compiled graph
    does not see the context length."""

    slot_mapping: torch.Tensor  # [rows]
    block_table: torch.Tensor  # [rows, num_blocks]
    context_lens: torch.Tensor  # [rows] int64: position + 1
    # A model with window tables: each sliding group's ([groups, rows] and [groups, rows, num_blocks];
    # engine_proc/sched/window_tables.py)
    window_slot_mapping: torch.Tensor | None = None
    window_block_table: torch.Tensor | None = None
    # A model with linear-attention layers: each row's slot [rows], each layer's pools of states (None for an
    # attention layer; engine_proc/model/hf_linear_attention.py)
    linear_slots: torch.Tensor | None = None
    linear_conv: list[torch.Tensor | None] | None = None
    linear_recurrent: list[torch.Tensor | None] | None = None


@dataclass
class GraphPrefillMetadata:
    """A compiled prompt (or mixed) step's (engine_proc/model/compiled_prefill.py): the Triton
    backend's flat view (AttentionMetadata's last fields), its tiles worked out before the graph."""

    slot_mapping: torch.Tensor  # [num_tokens]
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32
    seq_of_token: torch.Tensor  # [num_tokens] int32
    context_lens: torch.Tensor  # [num_tokens] int32
    tile_lens: torch.Tensor  # [num_tokens] int32


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    decode=None,
    prefill=None,
    gather=None,
) -> torch.Tensor:
    """Attention of the step's queries [T, H, D] over cached and new K/V (already written).

    `decode(q, k_cache, v_cache, meta)` attends the decode rows (torch_decode when None);
    `prefill(q, k, v)` a chunk whose tokens are its last keys, or returns None for SDPA (the
    CPU backend passes its kernels, engine_proc/attention/cpu.py); `gather(cache, block_table,
    length, dtype)` reads a chunk's cached context as [length, H_kv, D] (an int8 cache's dequantizing
    read; the blocks as they are when None)."""
    num_tokens = q.shape[0]
    num_decodes = meta.num_decode_tokens
    decode = decode or torch_decode
    if num_decodes == num_tokens:
        return decode(q, k_cache, v_cache, meta)
    out = torch.empty_like(q)
    if num_decodes:
        out[:num_decodes] = decode(q[:num_decodes], k_cache, v_cache, meta)
    for chunk in meta.prefills:
        if chunk.block_table is None:
            k_ctx = k[chunk.token_start : chunk.token_end]
            v_ctx = v[chunk.token_start : chunk.token_end]
        else:
            table = chunk.block_table.unsqueeze(0)
            if gather is not None:
                k_ctx = gather(k_cache, chunk.block_table, chunk.context_len, q.dtype)
                v_ctx = gather(v_cache, chunk.block_table, chunk.context_len, q.dtype)
            else:
                k_ctx = gather_blocks(k_cache, table)[0, : chunk.context_len]
                v_ctx = gather_blocks(v_cache, table)[0, : chunk.context_len]
        # The kernel applies the offset-causal mask itself: the chunk's tokens are the last keys
        # (not so when the context was padded past them).
        chunk_len = chunk.token_end - chunk.token_start
        o = None
        if prefill is not None and (chunk.block_table is None or chunk.context_len == chunk.start_pos + chunk_len):
            o = prefill(q[chunk.token_start : chunk.token_end], k_ctx, v_ctx)
        if o is not None:
            if chunk_len == num_tokens:  # the step's only chunk: no copy
                return o
            out[chunk.token_start : chunk.token_end] = o
            continue
        q_chunk = q[chunk.token_start : chunk.token_end].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(
            q_chunk,
            k_ctx.transpose(0, 1).unsqueeze(0),
            v_ctx.transpose(0, 1).unsqueeze(0),
            attn_mask=chunk.causal_mask,
            is_causal=chunk.causal_mask is None,
            enable_gqa=True,
        )
        out[chunk.token_start : chunk.token_end] = o[0].transpose(0, 1)
    return out


def torch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    return decode_attention(q, k_cache, v_cache, meta.decode_block_table, meta.decode_mask, meta.decode_context_len)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    mask: torch.Tensor | None,
    context_len: int | None = None,
) -> torch.Tensor:
    """One query token per row [B, H, D] against the blocks of `block_table` [B, num_blocks]
    (the first `context_len` keys, all when None), keys past each row's length masked by `mask`."""
    num_decodes, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    k_ctx = gather_blocks(k_cache, block_table)[:, :context_len].transpose(1, 2)
    v_ctx = gather_blocks(v_cache, block_table)[:, :context_len].transpose(1, 2)
    # One query per sequence: fold the query heads that share a KV head into the query
    # axis ([B, H_kv, group, D]) so SDPA needs neither enable_gqa nor a repeated K/V,
    # both of which take a much slower path on CPU with a mask.
    q_grouped = q.view(num_decodes, num_kv_heads, num_heads // num_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(q_grouped, k_ctx, v_ctx, attn_mask=mask)
    return o.reshape(num_decodes, num_heads, head_dim)


def additive_mask(context_lens: torch.Tensor, block_table: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """[B, 1, 1, width * block_size] in the cache's dtype: 0 for keys below each row's length, -inf past
    it (SDPA's CPU kernel takes an additive mask about 15% faster than a bool one)."""
    width = block_table.shape[1] * cache.shape[1]
    keep = torch.arange(width, device=context_lens.device) < context_lens.unsqueeze(1)
    mask = torch.zeros(keep.shape, dtype=cache.dtype, device=cache.device).masked_fill_(~keep, float("-inf"))
    return mask.view(-1, 1, 1, width)
