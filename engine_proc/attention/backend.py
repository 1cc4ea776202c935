"""The attention backends' interface, and its torch, batch-invariant and Triton implementations."""
from __future__ import annotations

import math

import torch

from rill.engine_proc.attention import graph_ops
from rill.engine_proc.attention.invariant import PAD_MULTIPLE, invariant_paged_attention
from rill.engine_proc.attention.kv_cache import (
    AttentionMetadata,
    GraphDecodeMetadata,
    GraphPrefillMetadata,
    paged_attention,
    write_kv,
)
from rill.engine_proc.model.step_inputs import prepare_flat_step, prepare_step
from rill.engine_proc.sched.batch import Batch

CPU = torch.device("cpu")
StepInputs = tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]


class AttentionBackend:
    """Prepares a step's metadata (`prepare`) and computes one layer's attention (`forward`: write the
    step's K/V, then attend). Its capabilities: `graph_decode_op`, the opaque op a compiled decode
    step calls (None: no compiled decode steps), and `fused_prompt_layers`, whether a step of fresh
    prompts may run each decoder layer as one C++ call (engine_proc/kernels/prefill_layer.py)."""

    name = "torch"
    flat = False  # the step's token rows in the batch's order (prepare_flat_step), else decodes first
    graph_decode_op = None
    fused_prompt_layers = False
    write = staticmethod(write_kv)  # the step's K/V [T, H_kv, D] into the cache at its slots

    def __init__(self, device: torch.device = CPU, block_size: int = 16) -> None:
        self.device, self.block_size = device, block_size

    def prepare(self, batch: Batch) -> StepInputs:
        """input_ids, positions, the attention metadata and the rows whose logits are needed."""
        return prepare_step(batch, self.block_size, self.device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The attention output [T, H, D] of the step's queries, after writing its K/V [T, H_kv, D]."""
        self.write(k_cache, v_cache, k, v, meta.slot_mapping)
        return paged_attention(q, k, v, k_cache, v_cache, meta)

    def masked_decode(self, q, k_cache, v_cache, meta: AttentionMetadata, window: int, softcap: float,
                      sinks: torch.Tensor | None) -> torch.Tensor | None:
        """The decode rows' attention (the first meta.num_decode_tokens of q, or every row of a flat
        backend) within a sliding window (0: none), with soft-capped scores (0: none) and attention
        sinks [H] (None), the step's K/V already written; None where this backend has no kernel for
        it (engine_proc/attention/masked.py attends them in torch)."""
        return None

    def graph_decode(self, q, k, v, meta: GraphDecodeMetadata, layer: int) -> torch.Tensor:
        return self.graph_decode_op(q, k, v, meta.slot_mapping, meta.block_table, meta.context_lens, layer)

    def graph_prefill(self, q, k, v, meta: GraphPrefillMetadata, layer: int) -> torch.Tensor:
        """A compiled prompt (or mixed) step's attention (engine_proc/model/compiled_prefill.py)."""
        return graph_ops.paged_prefill_attention(q, k, v, meta.slot_mapping, meta.block_tables, meta.seq_of_token,
                                                 meta.context_lens, meta.tile_lens, layer)

    def bind_kv_caches(self, kv_cache) -> None:
        """The caches the graphs' ops read by layer index (a cache passed in would be copied by the graph)."""
        graph_ops.bind_kv_caches(kv_cache)


class TorchBackend(AttentionBackend):
    """SDPA over gathered blocks, the twin every other backend is checked against; on the CPU or a GPU."""

    def __init__(self, device: torch.device = CPU, block_size: int = 16) -> None:
        super().__init__(device, block_size)
        self.graph_decode_op = graph_ops.paged_decode_attention


class InvariantBackend(AttentionBackend):
    """--batch-invariant in torch (engine_proc/attention/invariant.py): every context padded to whole
    vector widths and whole blocks, so a token's result does not depend on the rest of the step."""

    name = "batch-invariant"

    def __init__(self, device: torch.device, block_size: int) -> None:
        super().__init__(device, block_size)
        self.context_pad = math.lcm(PAD_MULTIPLE, block_size)

    def prepare(self, batch: Batch) -> StepInputs:
        return prepare_step(batch, self.block_size, self.device, context_pad=self.context_pad)

    def forward(self, q, k, v, k_cache, v_cache, meta):
        self.write(k_cache, v_cache, k, v, meta.slot_mapping)
        return invariant_paged_attention(q, k_cache, v_cache, meta)


class TritonBackend(AttentionBackend):
    """One Triton kernel for every token of a step (engine_proc/attention/triton.py), and on a GPU
    the K/V writes and compiled decode steps' attention in kernels of their own (triton_decode.py):
    the GPU's; on the CPU under Triton's interpreter (TRITON_INTERPRET=1), for tests, without
    compiled decode."""

    name = "triton"
    flat = True

    def __init__(self, device: torch.device, block_size: int) -> None:
        super().__init__(device, block_size)
        # Imported only when chosen: importing triton needs its GPU driver (or TRITON_INTERPRET=1).
        from rill.engine_proc.attention.triton import paged_attention_triton, tokens_per_tile
        from rill.engine_proc.attention.triton_decode import write_kv_triton

        self.kernel, self.tokens_per_tile = paged_attention_triton, tokens_per_tile
        if device.type == "cuda":  # else the class's torch write
            self.graph_decode_op = graph_ops.paged_decode_attention
            self.write = write_kv_triton

    def prepare(self, batch: Batch) -> StepInputs:
        return prepare_flat_step(batch, self.block_size, self.device)

    def forward(self, q, k, v, k_cache, v_cache, meta):
        self.write(k_cache, v_cache, k, v, meta.slot_mapping)
        # The step's tiles, worked out by its first layer for all of them (again for a draft model
        # whose heads group otherwise).
        per_tile = self.tokens_per_tile(q.shape[1], k_cache.shape[2])
        if meta.tile_lens is None or meta.tile_lens[0] != per_tile:
            from rill.engine_proc.attention.triton import tile_lens_of

            meta.tile_lens = (per_tile, tile_lens_of(meta.seq_of_token, per_tile))
        return self.kernel(q, k_cache, v_cache, meta.block_tables, meta.seq_of_token, meta.context_lens,
                           q.shape[-1] ** -0.5, meta.tile_lens[1])
