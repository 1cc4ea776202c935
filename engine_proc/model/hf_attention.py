"""Rill's paged attention inside any transformers model: registered in transformers' attention
interface as "rill_paged", so each attention layer's call writes its K/V into Rill's paged cache
and attends through the runner's backend, as vLLM's Transformers backend does.

Transformers builds no mask for an implementation it has no mask function for: the step's
sequences go as one row of tokens with their own positions, and the backend's metadata keeps
them apart. A layer with a sliding window, soft-capped logits or attention sinks goes through the
backend's masked_decode for its decode rows (on the CPU, the C++ decode kernel), and
engine_proc/attention/masked.py for the rest; every other layer through the backend's kernels. In
a step whose prompt chunk holds an image that attends both ways (Gemma 3) the image's rows see the
whole image: masked.py's key limits, or where no window masks the kernels' rows and those rows again
over the image's keys (attend_whole_images).
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from rill.engine_proc.attention.backend import AttentionBackend
from rill.engine_proc.attention.kv_cache import AttentionMetadata, GraphDecodeMetadata, KVCache
from rill.engine_proc.attention.masked import (
    ImageSpan,
    TokenTables,
    attend_whole_images,
    key_limits,
    masked_attention,
    row_order,
    token_tables,
)
from rill.engine_proc.sched.batch import Batch

IMPLEMENTATION = "rill_paged"


@dataclass
class PagedStep:
    """What a step's attention layers read: set by the runner around its forward."""

    backend: AttentionBackend
    kv_cache: KVCache
    meta: AttentionMetadata
    batch: Batch
    positions: torch.Tensor  # [T] each row's position
    longest: int  # the step's longest sequence, its chunk's end: a window at least this long masks nothing
    # A model with window tables: each sliding group's view of the step (window_view), group 1 first
    window_batches: list[Batch] = dataclasses.field(default_factory=list)
    window_metas: list[AttentionMetadata] = dataclasses.field(default_factory=list)
    # The rows of a prompt chunk's images that attend both ways (hf_vision.py whole_images)
    images: list[ImageSpan] = dataclasses.field(default_factory=list)

    @functools.cached_property
    def key_limits(self) -> torch.Tensor | None:
        """[T] the last key each row sees (masked.py key_limits), in a step with such images; else None."""
        return key_limits(self.images, self.positions) if self.images else None

    @functools.cached_property
    def rope_lens(self) -> torch.Tensor:
        """[T] each row's sequence length at the end of its chunk (engine_proc/model/hf_rope.py)."""
        seqs = row_order(self.batch, decodes_first=not self.backend.flat)
        lens = [s.start_pos + s.num_new_tokens for s in seqs for _ in range(s.num_new_tokens)]
        return torch.tensor(lens, dtype=torch.long, device=self.positions.device)

    @functools.cached_property
    def tables(self) -> TokenTables:
        """The masked layers' view of the rows, made by the first such layer of the step."""
        return token_tables(self.batch, self.backend.block_size, self.positions, decodes_first=not self.backend.flat)

    @functools.cached_property
    def window_tables(self) -> list[TokenTables]:
        return [token_tables(b, self.backend.block_size, self.positions, decodes_first=not self.backend.flat)
                for b in self.window_batches]


class _WindowTable:
    """A request seen through one sliding group's block table (engine_proc/sched/window_tables.py)."""

    __slots__ = ("_req", "_group")

    def __init__(self, req, group: int) -> None:
        self._req, self._group = req, group

    @property
    def block_ids(self) -> list[int]:
        return self._req.window_block_ids[self._group]

    def __getattr__(self, name: str):
        return getattr(self._req, name)


def window_view(batch: Batch, group: int) -> Batch:
    """`batch` with each request's window table of sliding group `group` (from 0) as its block_ids: the
    step's inputs built from it (the backend's prepare, token_tables) address that group's blocks."""
    return Batch([dataclasses.replace(s, req=_WindowTable(s.req, group)) for s in batch.seqs])


_current = threading.local()


def current_step() -> PagedStep:
    step: PagedStep | None = getattr(_current, "step", None)
    if step is None:
        raise RuntimeError("a rill_paged layer ran outside a runner step")
    return step


class step_context:
    """`with step_context(step):` the model's forward inside it attends through `step`."""

    def __init__(self, step: PagedStep) -> None:
        self.step = step

    def __enter__(self) -> PagedStep:
        _current.step = self.step
        return self.step

    def __exit__(self, *exc) -> None:
        _current.step = None


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask, scaling: float | None = None, dropout: float = 0.0,
                            sliding_window: int | None = None, softcap: float | None = None,
                            s_aux: torch.Tensor | None = None, rill_graph: GraphDecodeMetadata | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [1, H, T, D], key and value [1, H_kv, T, D]
    after RoPE; the output [1, T, H, D]. `rill_graph`: a compiled decode step's metadata, which the
    runner passes through the model's forward (transformers hands its extra arguments down to here)."""
    layer = module.layer_idx
    sliding_window = sliding_window or getattr(module, "rill_window", None)  # the model's, every layer's (hf_paged.py)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    value_dim = v.shape[-1]
    if value_dim < k.shape[-1]:  # MLA (DeepSeek V2 and V3, GLM-4.7-Flash): values narrower than keys, cached padded
        v = torch.nn.functional.pad(v, (0, k.shape[-1] - value_dim))
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scaling is None else scaling
    # The kernels scale by 1/sqrt(D): a family's own scale goes on their queries.
    kernel_q = q if scale == head_dim**-0.5 else q * (scale * head_dim**0.5)
    # A model with window tables: 0 for a global layer, 1.. for a sliding group's (hf_paged.py)
    group = getattr(module, "rill_table_group", 0)
    if rill_graph is not None:  # one opaque op writes and attends the layer's cache, named by its index
        slots, table = ((rill_graph.window_slot_mapping[group - 1], rill_graph.window_block_table[group - 1])
                        if group else (rill_graph.slot_mapping, rill_graph.block_table))
        out = torch.ops.rill_cpu.paged_decode_layer(kernel_q, k, v, slots, table, rill_graph.context_lens, layer,
                                                    sliding_window or 0, softcap or 0.0, s_aux)
        return out[..., :value_dim].unsqueeze(0), None
    step = current_step()
    k_cache, v_cache = step.kv_cache.k_caches[layer], step.kv_cache.v_caches[layer]
    meta = step.window_metas[group - 1] if group else step.meta
    window = sliding_window if sliding_window and sliding_window < step.longest else None
    if window is not None or softcap or s_aux is not None:
        limits = step.key_limits
        step.backend.write(k_cache, v_cache, k, v, meta.slot_mapping)
        # The decode rows through the backend's kernel where it has one (on the CPU, the C++ decode
        # kernel takes the window, the soft-cap and the sinks), the prompt chunks in torch.
        decoded = step.backend.masked_decode(kernel_q, k_cache, v_cache, meta, window or 0, softcap or 0.0, s_aux)
        if decoded is not None and decoded.shape[0] == q.shape[0] and limits is None:
            out = decoded
        else:
            tables = step.window_tables[group - 1] if group else step.tables
            if decoded is not None and decoded.shape[0] == q.shape[0]:  # a flat backend's, of every row
                decoded = decoded[tables.single_rows]
            out = masked_attention(q, k_cache, v_cache, tables, scale, window, softcap or None, s_aux, decoded,
                                   limits)
    else:
        out = step.backend.forward(kernel_q, k, v, k_cache, v_cache, meta)
        if step.images:  # an image's tokens see the rest of their image too: those rows again
            tables = step.window_tables[group - 1] if group else step.tables
            attend_whole_images(q, k_cache, v_cache, tables, scale, step.images, out)
    return out[..., :value_dim].unsqueeze(0), None


AttentionInterface.register(IMPLEMENTATION, paged_attention_forward)
