"""Compiled prompt steps on a GPU: the model's forward through torch.compile for every step that is not
a decode-only step (prompts, chunks of them, prompts mixed with decodes).

Run eagerly, a 512-token prompt step of the bundled model's shape launched about 1,300 kernels from
Python, each op's dispatch costing more than its kernel (39 ms for 3 ms of GPU work, measured on an
H200). Compiled, Inductor fuses the norms, residual adds, RoPE and SiLU into a few Triton kernels
around the matmuls, and attention is one opaque op a layer (`rill::paged_prefill_attention`: the
K/V write and the Triton kernel over the paged cache), as in the compiled decode steps. Every
dimension that varies from step to step (tokens, sequences, block-table width, sampled rows) is
unbacked, so one compiled graph serves every step: nothing compiles after start. No CUDA graph:
the token count varies too widely to record one per size (vLLM's piecewise graphs are a next step).
"""
from __future__ import annotations

import logging
import time

import torch

from rill.engine_proc.attention.kv_cache import AttentionMetadata, GraphPrefillMetadata
from rill.engine_proc.attention.kv_layout import num_kv_heads_of
from rill.engine_proc.model.decode_graphs import GUARDS, default_cache_dir_env, own_forward

log = logging.getLogger("rill.model")


class CompiledPrefill:
    """`run(input_ids, positions, meta, logits_indices)`: the Triton backend's flat step (prepare_flat_step)
    through the compiled forward; the rows' logits, as the eager model gives them."""

    def __init__(self, model: torch.nn.Module, kv_cache, device: torch.device, backend: str = "inductor") -> None:
        """`backend`: torch.compile's (a CPU test takes "aot_eager": Inductor's CPU linears refuse unbacked sizes)."""
        from rill.engine_proc.attention.triton import tile_lens_of, tokens_per_tile

        default_cache_dir_env()
        model.attention.bind_kv_caches(kv_cache)  # the op reads each layer's cache by its index
        config = model.config
        self.model, self.kv_cache, self.device = model, kv_cache, device
        self.tile_lens_of = tile_lens_of
        self.per_tile = tokens_per_tile(config.num_attention_heads, num_kv_heads_of(config))
        options = GUARDS if backend == "inductor" else None
        self.compiled = torch.compile(own_forward(model), backend=backend, dynamic=False, fullgraph=True, options=options)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            logits_indices: torch.Tensor) -> torch.Tensor:
        # A step of prompt chunks none of which ends its prompt samples no row: Inductor's kernels for
        # a dimension of 0 divide by it at launch (seen on an H200, torch 2.11), so such a step computes
        # one row's logits and returns none.
        no_rows = logits_indices.shape[0] == 0
        if no_rows:
            logits_indices = logits_indices.new_zeros(1)
        graph_meta = GraphPrefillMetadata(meta.slot_mapping, meta.block_tables, meta.seq_of_token, meta.context_lens,
                                          self.tile_lens_of(meta.seq_of_token, self.per_tile))
        logits = self.compiled_forward(input_ids, positions, graph_meta, logits_indices)
        return logits[:0] if no_rows else logits

    def compiled_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, graph_meta: GraphPrefillMetadata,
                         logits_indices: torch.Tensor) -> torch.Tensor:
        """The compiled graph on a step's tensors, every size unbacked: no size compiles a graph of its own."""
        mark = torch._dynamo.decorators.mark_unbacked
        for t in (input_ids, positions, graph_meta.slot_mapping, graph_meta.seq_of_token, graph_meta.context_lens,
                  graph_meta.tile_lens, logits_indices, graph_meta.block_tables):
            mark(t, 0)
        mark(graph_meta.block_tables, 1)
        return self.compiled(input_ids, positions, graph_meta, self.kv_cache, logits_indices)

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile (or load from the disk cache) now, on two steps of other shapes in the padding block 0
        (the second must find the first's graph); the seconds it took."""
        started = time.perf_counter()
        block_size = self.kv_cache.k_caches[0].shape[1]
        for lens in ((5, 3), (2, 1, 4)):  # tokens per sequence, all in block 0
            seq_of_token = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lens)])
            positions = torch.cat([torch.arange(n) for n in lens])
            to = lambda t: t.to(self.device)  # noqa: E731
            meta = AttentionMetadata(slot_mapping=to(positions % block_size),
                                     block_tables=to(torch.zeros(len(lens), len(lens), dtype=torch.int32)),
                                     seq_of_token=to(seq_of_token), context_lens=to((positions + 1).to(torch.int32)))
            ends = torch.tensor(lens).cumsum(0) - 1
            self.run(to(torch.zeros(len(positions), dtype=torch.long)), to(positions), meta, to(ends))
        elapsed = time.perf_counter() - started
        log.info("prompt steps compiled in %.1f s", elapsed)
        return elapsed
