"""Compiled decode steps: the model's forward through torch.compile for decode-only batches.

As vLLM compiles its model and captures a CUDA graph per padded batch size, the engine compiles
the forward once at start (Inductor) and runs every decode-only step through it. On the CPU this
removes the per-op Python and dispatch cost of about a thousand small ops per step (norms, RoPE,
residuals, SiLU), which Inductor fuses into a few C++ loops around the linears and the attention.
Attention stays one opaque op, the backend's graph_decode_op (`rill_cpu::paged_decode_layer`,
the C++ kernel, on the "cpu" backend; `rill::paged_decode_attention` otherwise), so the context
length varies freely inside the graph. Prefill and mixed steps run eagerly.

Inductor's compiled code is cached on disk (`TORCHINDUCTOR_CACHE_DIR`, by default under Rill's
cache folder): the first start compiles, a restart mostly loads.
"""
from __future__ import annotations

import logging
import os
import time
import types
from collections.abc import Callable

import numpy as np
import torch

from rill.engine_proc.attention.kv_cache import GraphDecodeMetadata
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.sched.request import EngineRequest

log = logging.getLogger("rill.model")

# Padded batch sizes on a GPU, where each becomes a CUDA graph (mode "reduce-overhead").
CUDA_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


# No guards on the model's modules, whose checks ran on every step (0.8 ms of a 17 ms decode step at
# batch 1 on a Zen 4): the modules do not change after the compile (LoRA wraps its linears when the
# runner is built, before it; adapters load into slots of those, and their steps run eagerly).
GUARDS = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}


def own_forward(model: torch.nn.Module):
    """`model.forward` on a code object of its own, to compile. torch.compile keeps its compiled code
    on the function's code object, which every instance of the class shares: with the module guards
    gone (GUARDS) and the weights frozen into the graph, a second model of the class in the process
    (a draft model, another test's) would run the first one's graph and weights."""
    func = model.forward.__func__
    clone = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__, func.__defaults__,
                               func.__closure__)
    clone.__kwdefaults__ = func.__kwdefaults__
    return types.MethodType(clone, model)


def default_cache_dir_env() -> None:
    """Inductor's on-disk cache under Rill's cache folder, unless the user chose one."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from rill.engine_proc.model.bundled import default_cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_cache_dir() / "inductor")


class DecodeGraphs:
    """The model's forward compiled for decode-only batches; `run(batch)` gives their logits.

    One compiled graph serves every batch size: on the CPU every context length too (both
    dimensions dynamic); measured there, it is as fast at batch 1 as a graph compiled for that size
    alone, and one compile instead of one per size keeps start-up short. On a GPU each batch is
    padded to the next of `CUDA_SIZES` and the block table to the longest sequence's width, and a
    CUDA graph is captured per padded size at start around the compiled code, as vLLM captures them:
    its inputs are static buffers (StepBuffers), so a step copies its inputs in and replays, and no
    Python of torch.compile's (guards, graph-tree bookkeeping) runs per step. Where a capture fails,
    torch.compile's own CUDA graphs ("reduce-overhead") take over.
    """

    def __init__(self, model: torch.nn.Module, kv_cache, block_size: int, device: torch.device,
                 max_num_seqs: int, max_model_len: int | None = None, cpp_wrapper: bool = True) -> None:
        """`max_model_len`: the longest sequence a step can hold (the model's, the scheduler's limit or
        the cache's): on a GPU the block tables are that wide. `cpp_wrapper` (the CPU): Inductor's C++ wrapper
        calls the step's kernels and operators, where its Python wrapper spent about 0.6 ms a step on the bundled
        model's ~150 operator calls (an int4 step at batch 1 on a 2-core Xeon: 3.99-4.22 against 4.64-4.74 ms; a cold
        compile of its graph took 42 s against 27: docs/cpu-speed.md)."""
        default_cache_dir_env()
        # A request's rotary positions past its tokens' index (3-D rotary models with images: hf_vision.py)
        self.rope_offset: Callable[[EngineRequest], int] | None = None
        # A model with linear-attention layers: their states' slots and pools go in with each step's inputs (the CPU)
        self.linear_states = None
        model.attention.bind_kv_caches(kv_cache)  # the op reads each layer's cache by its index
        self.kv_cache = kv_cache
        # Window tables (engine_proc/sched/window_tables.py): each sliding group's slots and table too
        self.num_groups = getattr(kv_cache, "num_window_groups", 0)
        assert not (self.num_groups and device.type == "cuda"), "window tables are compiled on the CPU only"
        self.block_size = block_size
        self.device = device
        self.max_num_seqs = max_num_seqs
        # A CUDA graph replays fixed shapes: the block table is as wide as the longest sequence's
        # (the kernel reads each row only up to its length); on the CPU its width follows the step.
        self.table_width = None
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] | None = None  # padded size ->
        if device.type == "cuda":
            self.table_width = -(-(max_model_len or model.config.max_position_embeddings) // block_size)
            self.sizes = tuple(s for s in CUDA_SIZES if s < max_num_seqs) + (max_num_seqs,)
            self.inputs = StepBuffers(self.sizes[-1], self.table_width, device)
            self.graphs = {}
            self.model = model
            self.compiled = torch.compile(own_forward(model), dynamic=False, fullgraph=True, options=GUARDS)
        else:
            import torch._inductor.config as inductor_config

            # Weights become constants of the graph, so Inductor prepacks them for oneDNN itself.
            inductor_config.freezing = True
            self.sizes = None
            self.compiled = torch.compile(own_forward(model), dynamic=False, fullgraph=True,
                                          options={**GUARDS, "cpp_wrapper": cpp_wrapper})

    def can_run(self, batch: Batch) -> bool:
        """Decode-only: one token per sequence, and its drafts (speculative decoding), each a row."""
        if not all(s.num_new_tokens == 1 + len(s.draft_ids) for s in batch.seqs):
            return False
        return self.sizes is None or batch.num_tokens <= self.sizes[-1]

    def padded_size(self, num_rows: int) -> int:
        if self.sizes is None:
            return num_rows
        return next(size for size in self.sizes if size >= num_rows)

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits of the rows of batch.sampled_seqs (step_inputs.logits_rows' order) for a batch of
        one token per sequence, and its drafts: each draft a row of its own at the next position,
        against the same blocks (the kernel writes every row's K/V before any row attends)."""
        bs = self.block_size
        num_rows = batch.num_tokens
        padded = self.padded_size(num_rows)
        width = self.table_width or -(-max(s.start_pos + s.num_new_tokens for s in batch.seqs) // bs)
        # Per row its input id, position, slot and context length (4 rows of `padded`), then the
        # block table; padded rows are token 0 at position 0 in the padding block 0, context 1. With
        # window tables, each group's slots and table follow.
        num_tables = 1 + self.num_groups
        num_fields = 3 + num_tables
        host = (self.inputs.host(padded, width) if self.sizes
                else np.zeros(padded * (num_fields + num_tables * width), dtype=np.int64))
        fields = host[: num_fields * padded].reshape(num_fields, padded)
        tables = host[num_fields * padded:].reshape(num_tables, padded, width)
        fields[:3], fields[3] = 0, 1
        sampled_rows, row = [], 0
        for s in batch.seqs:
            n, start = s.num_new_tokens, s.start_pos
            if s.needs_sample:
                sampled_rows.extend(range(row, row + n))
            num_blocks = (start + n - 1) // bs + 1
            fields[0, row:row + n] = s.token_ids
            fields[1, row:row + n] = range(start, start + n)
            tables[0, row:row + n, :num_blocks] = s.req.block_ids[:num_blocks]
            for j, window_table in enumerate(s.req.window_block_ids):
                tables[1 + j, row:row + n, :num_blocks] = window_table[:num_blocks]
            row += n
        positions = fields[1, :num_rows]
        rows, block_index, offset = np.arange(num_rows), positions // bs, positions % bs
        for j in range(1 + self.num_groups):  # the slots: the global table's, then each window table's
            fields[2 if j == 0 else 3 + j, :num_rows] = tables[j, rows, block_index] * bs + offset
        fields[3, :num_rows] = positions + 1
        if self.rope_offset is not None:  # rotary positions behind the tokens' index (hf_vision.py): slots are by index
            row = 0
            for s in batch.seqs:
                fields[1, row:row + s.num_new_tokens] += self.rope_offset(s.req)
                row += s.num_new_tokens
        if not self.sizes:  # tensors of their own (inputs sharing a buffer would be guarded on as aliases)
            ids, positions, slots, context_lens = (torch.from_numpy(f.copy()) for f in fields[:4])
            window = ((torch.from_numpy(fields[4:].copy()), torch.from_numpy(tables[1:].copy()))
                      if self.num_groups else None)
            linear = self.linear_states.slots(batch, padded) if self.linear_states is not None else None
            logits = self._forward(ids, positions, slots, torch.from_numpy(tables[0].copy()), context_lens, window,
                                   linear)
        elif self.graphs:  # the inputs into the captured graph's buffers, then the graph
            self.inputs.to_device(padded, width)
            graph, logits = self.graphs[padded]
            graph.replay()
        else:
            logits = self._forward(*self.inputs.to_device(padded, width))
        if len(sampled_rows) == num_rows:
            return logits[:num_rows]
        # A one-token chunk in the middle of a prompt is computed but not sampled.
        return logits[torch.tensor(sampled_rows, dtype=torch.long, device=logits.device)]

    def _forward(self, input_ids, positions, slot_mapping, block_table, context_lens, window=None,
                 linear_slots=None) -> torch.Tensor:
        """`window`: the window tables' slot mappings [groups, rows] and tables [groups, rows, width];
        `linear_slots` [rows]: each row's slot of the linear-attention layers' states."""
        to = lambda t: t.to(self.device)  # noqa: E731
        meta = GraphDecodeMetadata(to(slot_mapping), to(block_table), to(context_lens))
        if window is not None:
            meta.window_slot_mapping, meta.window_block_table = window
        if linear_slots is not None:  # the pools grow with the requests running at once: their rows vary
            meta.linear_slots = to(linear_slots)
            states, layers = self.linear_states, range(1 + max(self.linear_states.conv))
            meta.linear_conv, meta.linear_recurrent = ([pools.get(i) for i in layers]
                                                       for pools in (states.conv, states.recurrent))
            for pool in (p for p in meta.linear_conv + meta.linear_recurrent if p is not None):
                torch._dynamo.decorators.mark_unbacked(pool, 0)
            torch._dynamo.decorators.mark_unbacked(meta.linear_slots, 0)
        logits_indices = torch.arange(input_ids.shape[0], device=self.device)
        args = (to(input_ids), to(positions), meta, self.kv_cache, logits_indices)
        # One compiled graph for every batch size (on a GPU, one CUDA graph recorded from it per
        # padded size) and, on the CPU, every context width. Unbacked: no graph of its own for a
        # size of 1 (one block, one row), which a plain dynamic dimension gets.
        mark = torch._dynamo.decorators.mark_unbacked
        if self.table_width is None:
            mark(meta.block_table, 1)
        for t in (args[0], args[1], meta.slot_mapping, meta.block_table, meta.context_lens, logits_indices):
            mark(t, 0)
        if window is not None:  # [groups, rows(, width)]
            mark(meta.window_slot_mapping, 1)
            mark(meta.window_block_table, 1)
            mark(meta.window_block_table, 2)
        if self.sizes and self.graphs is None:  # torch.compile's CUDA graphs: the last step's outputs are consumed
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(*args)

    def _capture(self) -> None:
        """A CUDA graph per padded size, the largest first (the smaller reuse its memory), each
        around the compiled forward on the static buffers' first rows (padding rows: the block 0)."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            args = self.inputs.static(size, self.table_width)
            self._forward(*args)  # the first compiles; every later size runs the same compiled code
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(*args)
            self.graphs[size] = (graph, logits)

    def _graph_trees(self) -> None:
        """torch.compile's own CUDA graphs instead, recorded on each size's second call."""
        self.graphs = None
        self.compiled = torch.compile(own_forward(self.model), dynamic=False, fullgraph=True,
                                      options={**GUARDS, "triton.cudagraphs": True})
        for size in self.sizes:
            for _ in range(2):
                zeros = lambda: torch.zeros(size, dtype=torch.long)  # noqa: E731 (distinct: no aliasing guard)
                self._forward(zeros(), zeros(), zeros(), torch.zeros(size, self.table_width, dtype=torch.long),
                              torch.ones(size, dtype=torch.long))

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile (or load from the disk cache) now, on padding rows; the seconds it took."""
        started = time.perf_counter()
        if self.sizes:
            try:
                self._capture()
            except Exception as exc:  # an unsupported torch: its own CUDA graphs, with more Python a step
                log.warning("CUDA graph capture failed (%s: %s): torch.compile's CUDA graphs instead",
                            type(exc).__name__, exc)
                self._graph_trees()
        else:  # two context widths, since that dimension is dynamic on the CPU
            for size, num_blocks in ((1, 1), (1, 3), (3, 1), (3, 3)):
                zeros = lambda: torch.zeros(size, dtype=torch.long)  # noqa: E731 (distinct: no aliasing guard)
                table = lambda: torch.zeros(size, num_blocks, dtype=torch.long)  # noqa: E731
                groups = self.num_groups
                window = (torch.zeros(groups, size, dtype=torch.long),
                          torch.zeros(groups, size, num_blocks, dtype=torch.long)) if groups else None
                linear = zeros() if self.linear_states is not None else None  # the scratch slot 0
                self._forward(zeros(), zeros(), zeros(), table(), torch.ones(size, dtype=torch.long), window, linear)
        elapsed = time.perf_counter() - started
        log.info("decode graphs compiled in %.1f s (%s)", elapsed, "one for every batch size" if self.sizes is None
                 else f"CUDA graphs {'captured' if self.graphs else 'by torch.compile'} for batch sizes {list(self.sizes)}")
        return elapsed


class StepBuffers:
    """A decode step's inputs on their way to the GPU: written into one pinned host buffer, copied without
    blocking the host into five device tensors of their own (inputs sharing a buffer would be guarded
    on as aliases). The host buffer is written again only once the last step's copies have left it."""

    def __init__(self, max_rows: int, width: int, device: torch.device) -> None:
        self._pinned = torch.zeros(max_rows * (4 + width), dtype=torch.long, pin_memory=True)
        self._numpy = self._pinned.numpy()
        self._fields = [torch.zeros(max_rows, dtype=torch.long, device=device) for _ in range(4)]
        self._table = torch.zeros(max_rows * width, dtype=torch.long, device=device)
        self._copied = torch.cuda.Event()  # recorded after each step's copies (waiting on it unrecorded returns)

    def host(self, rows: int, width: int) -> np.ndarray:
        self._copied.synchronize()
        host = self._numpy[: rows * (4 + width)]
        host[4 * rows:] = 0
        return host

    def static(self, rows: int, width: int) -> tuple[torch.Tensor, ...]:
        """The device tensors of `rows` padding rows (token 0 at position 0, slot 0 of block 0), as
        to_device gives them: the same addresses every step, which a captured CUDA graph reads."""
        ids, positions, slots, context_lens = (field[:rows] for field in self._fields)
        for field in (ids, positions, slots):
            field.zero_()
        context_lens.fill_(1)
        table = self._table[: rows * width]
        table.zero_()
        return ids, positions, slots, table.view(rows, width), context_lens

    def to_device(self, rows: int, width: int) -> tuple[torch.Tensor, ...]:
        """input ids, positions, slots [rows], the block table [rows, width] and context lengths [rows]."""
        out = []
        for i, field in enumerate(self._fields):
            out.append(field[:rows])
            out[-1].copy_(self._pinned[i * rows:(i + 1) * rows], non_blocking=True)
        table = self._table[: rows * width]
        table.copy_(self._pinned[4 * rows: rows * (4 + width)], non_blocking=True)
        self._copied.record()
        return (*out[:3], table.view(rows, width), out[3])
