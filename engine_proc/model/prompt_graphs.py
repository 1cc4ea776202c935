"""CUDA graphs of the compiled prompt step: every step that is not decode-only (prompts, chunks of them,
prompts mixed with decodes), padded to a token bucket and replayed, as vLLM replays its piecewise graphs.

The compiled prompt step (compiled_prefill.py) still launched its ~500 kernels a step from Python: a
512-token prompt of the bundled model's shape took 15.8 ms of host time for 2.0 ms of GPU work (H100).
Its one compiled graph takes every size, so a CUDA graph is captured from it at start for each pair of
  - a token bucket (16, 24, 32, 48, ... up to --max-num-batched-tokens): the step's tokens, then padding
    tokens: id 0 at position 0 of a sequence of their own whose blocks are the null block 0, where they
    write and read; and
  - a bucket of sampled rows (1, 4, 16, 64, ... up to --max-num-seqs), padded with row 0.
Attention is inside the graph: its kernel's grid is one program per token, and the tiles
(`tile_lens`, which tokens each program covers) are worked out on the host with the other inputs. A step
writes its inputs into pinned host buffers with numpy, copies them into the graph's static tensors
without blocking, replays, and reads its rows' logits from one shared output. A step the buckets do not
hold (more tokens, sequences or rows) runs through the compiled step itself.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from rill.engine_proc.attention.kv_cache import GraphPrefillMetadata
from rill.engine_proc.model.step_inputs import logits_rows
from rill.engine_proc.sched.batch import Batch

log = logging.getLogger("rill.model")


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """16, 24, 32, 48, 64, ... (a power of two and one and a half times it) below max_tokens, then max_tokens."""
    sizes, size = [], 16
    while size < max_tokens:
        sizes += [size, size * 3 // 2]
        size *= 2
    return tuple(s for s in sizes if s < max_tokens) + (max_tokens,)


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """1, 4, 16, 64, ... below max_rows, then max_rows."""
    sizes, size = [], 1
    while size < max_rows:
        sizes.append(size)
        size *= 4
    return tuple(sizes) + (max_rows,)


class PromptInputs:
    """A padded prompt step's inputs: host arrays (pinned on a GPU) filled with numpy, then copied into
    static device tensors of their own (inputs sharing a buffer would be guarded on as aliases), the same
    addresses every step, which a captured graph reads."""

    def __init__(self, max_tokens: int, max_rows: int, max_seqs: int, width: int, block_size: int,
                 per_tile: int, device: torch.device) -> None:
        self.block_size, self.per_tile, self.width = block_size, per_tile, width
        pin = device.type == "cuda"
        self._host64 = torch.zeros(3 * max_tokens + max_rows, dtype=torch.long, pin_memory=pin)
        self._host32 = torch.zeros(3 * max_tokens + (max_seqs + 1) * width, dtype=torch.int32, pin_memory=pin)
        self._np64, self._np32 = self._host64.numpy(), self._host32.numpy()
        zeros = lambda n, dtype=torch.int32: torch.zeros(n, dtype=dtype, device=device)  # noqa: E731
        # ids, positions, slots; seq_of_token, context_lens, tile_lens; the block table; the sampled rows
        self.fields64 = [zeros(max_tokens, torch.long) for _ in range(3)]
        self.fields32 = [zeros(max_tokens) for _ in range(3)]
        self.table = zeros((max_seqs + 1) * width).view(max_seqs + 1, width)
        self.rows = zeros(max_rows, torch.long)
        self._copied = torch.cuda.Event() if pin else None  # the last step's copies have left the host buffers

    def fill(self, batch: Batch, num_tokens: int, num_rows: int) -> None:
        """Writes the step, padded to num_tokens tokens and num_rows logits rows (at least logits_rows'),
        into the host arrays."""
        if self._copied is not None:
            self._copied.synchronize()
        bs, width, per_tile = self.block_size, self.width, self.per_tile
        n_seqs = len(batch.seqs)
        ids, positions, slots = self._np64[: 3 * num_tokens].reshape(3, num_tokens)
        seq_of_token, context_lens, tile_lens = self._np32[: 3 * num_tokens].reshape(3, num_tokens)
        table = self._np32[3 * num_tokens: 3 * num_tokens + (n_seqs + 1) * width].reshape(n_seqs + 1, width)
        tile_lens[:] = 0
        start_row: dict[int, int] = {}
        row = 0
        for i, s in enumerate(batch.seqs):
            n, start = s.num_new_tokens, s.start_pos
            blocks = s.req.block_ids[: (start + n - 1) // bs + 1]
            table[i, : len(blocks)] = blocks  # past them the row is stale: the kernel reads only up to the context
            end = row + n
            ids[row:end] = s.token_ids
            positions[row:end] = np.arange(start, start + n)
            seq_of_token[row:end] = i
            leads = np.arange(row, end, per_tile)
            tile_lens[leads] = np.minimum(per_tile, end - leads)
            start_row[id(s)] = row
            row = end
        pos = positions[:row]
        slots[:row] = table[seq_of_token[:row], pos // bs].astype(np.int64) * bs + pos % bs
        context_lens[:row] = pos + 1
        # Padding tokens: a sequence of their own (the table's row n_seqs) at position 0 of block 0.
        ids[row:], positions[row:], slots[row:] = 0, 0, 0
        seq_of_token[row:], context_lens[row:] = n_seqs, 1
        table[n_seqs, 0] = 0
        leads = np.arange(row, num_tokens, per_tile)
        tile_lens[leads] = np.minimum(per_tile, num_tokens - leads)
        rows = logits_rows(batch, start_row)
        sampled = self._np64[3 * num_tokens: 3 * num_tokens + num_rows]
        sampled[: len(rows)], sampled[len(rows):] = rows, 0
        self._num_seqs = n_seqs

    def to_device(self, num_tokens: int, num_rows: int) -> None:
        """The filled step into the static tensors, without blocking the host."""
        for i, field in enumerate(self.fields64):
            field[:num_tokens].copy_(self._host64[i * num_tokens:(i + 1) * num_tokens], non_blocking=True)
        self.rows[:num_rows].copy_(self._host64[3 * num_tokens: 3 * num_tokens + num_rows], non_blocking=True)
        for i, field in enumerate(self.fields32):
            field[:num_tokens].copy_(self._host32[i * num_tokens:(i + 1) * num_tokens], non_blocking=True)
        used = (self._num_seqs + 1) * self.width  # the step's rows of the table and the padding row
        self.table.view(-1)[:used].copy_(self._host32[3 * num_tokens: 3 * num_tokens + used], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def static(self, num_tokens: int, num_rows: int) -> tuple:
        """(input_ids, positions, GraphPrefillMetadata, rows): views of the static tensors, the same
        addresses every step, which a captured graph reads."""
        ids, positions, slots = (field[:num_tokens] for field in self.fields64)
        seq_of_token, context_lens, tile_lens = (field[:num_tokens] for field in self.fields32)
        meta = GraphPrefillMetadata(slots, self.table, seq_of_token, context_lens, tile_lens)
        return ids, positions, meta, self.rows[:num_rows]


class PromptGraphs:
    """`run(batch)`: the logits of a prompt (or mixed) step's rows (step_inputs.logits_rows' order) through
    the captured graph of its buckets; None for a step larger than the largest."""

    def __init__(self, prefill, block_size: int, max_num_seqs: int, max_tokens: int, max_model_len: int,
                 device: torch.device) -> None:
        """`prefill`: a CompiledPrefill (its compiled forward, the model, the KV cache)."""
        self.prefill, self.device = prefill, device
        self.token_sizes = token_buckets(max_tokens)
        self.row_sizes = row_buckets(max_num_seqs)
        self.max_num_seqs = max_num_seqs
        width = -(-max_model_len // block_size)
        self.inputs = PromptInputs(max_tokens, max_num_seqs, max_num_seqs, width, block_size, prefill.per_tile, device)
        self.logits: torch.Tensor | None = None  # [the largest row bucket, vocab]: every graph's rows
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def _forward(self, num_tokens: int, num_rows: int) -> None:
        """The compiled step on the static tensors (what a capture records)."""
        logits = self.prefill.compiled_forward(*self.inputs.static(num_tokens, num_rows))
        if self.logits is None:  # the model's logits dtype, known from its first step (before any capture)
            self.logits = logits.new_empty(self.row_sizes[-1], logits.shape[-1])
        self.logits[:num_rows].copy_(logits)  # one output for every graph: theirs are freed after the capture

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor | None:
        # The rows logits_rows lays out: each sampled seq's last token and drafts, then prompt-scoring rows.
        num_rows = sum(s.num_logits_rows for s in batch.sampled_seqs) + sum(len(s.prompt_scored)
                                                                            for s in batch.scoring_seqs)
        num_tokens = batch.num_tokens
        if len(batch.seqs) > self.max_num_seqs or num_tokens > self.token_sizes[-1] or num_rows > self.row_sizes[-1]:
            return None
        padded_tokens = next(t for t in self.token_sizes if t >= num_tokens)
        padded_rows = next(r for r in self.row_sizes if r >= num_rows)
        self.inputs.fill(batch, padded_tokens, padded_rows)
        self.inputs.to_device(padded_tokens, padded_rows)
        graph = self.graphs.get((padded_tokens, padded_rows))
        if graph is None:  # not captured (the CPU's tests): the compiled step on the same padded inputs
            self._forward(padded_tokens, padded_rows)
        else:
            graph.replay()
        return self.logits[:num_rows]

    @torch.inference_mode()
    def capture(self) -> float:
        """A CUDA graph per (token bucket, row bucket), the largest first (the smaller reuse its memory), on
        padding tokens; the seconds it took."""
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        empty = Batch()
        for num_tokens in reversed(self.token_sizes):
            for num_rows in reversed([r for r in self.row_sizes if r <= num_tokens]):
                self.inputs.fill(empty, num_tokens, num_rows)
                self.inputs.to_device(num_tokens, num_rows)
                self._forward(num_tokens, num_rows)  # compiled already: unbacked sizes take every bucket
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._forward(num_tokens, num_rows)
                self.graphs[num_tokens, num_rows] = graph
        self._check(empty)
        elapsed = time.perf_counter() - started
        log.info("prompt steps: %d CUDA graphs captured in %.1f s (tokens up to %d, sampled rows up to %d)",
                 len(self.graphs), elapsed, self.token_sizes[-1], self.row_sizes[-1])
        return elapsed

    def _check(self, empty: Batch) -> None:
        """A replay gives what the compiled step gives on the same inputs (the smallest buckets'), or the
        runner serves without the graphs (it catches this)."""
        num_tokens, num_rows = self.token_sizes[0], self.row_sizes[0]
        self.inputs.fill(empty, num_tokens, num_rows)
        self.inputs.to_device(num_tokens, num_rows)
        self._forward(num_tokens, num_rows)
        want = self.logits[:num_rows].clone()
        self.logits.zero_()
        self.graphs[num_tokens, num_rows].replay()
        if not torch.allclose(self.logits[:num_rows].float(), want.float(), atol=1e-3, rtol=1e-3):
            self.graphs.clear()
            raise RuntimeError("a replayed prompt-step graph does not give the compiled step's logits")
