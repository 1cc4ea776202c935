"""The "cpu" attention backends: Rill's C++ kernels (kernels/csrc/paged_decode.cpp, prefill_attention.cpp).

The torch path gathers each row's K/V blocks into a contiguous copy, then runs SDPA with a mask
over the longest context in the step: at batch 32 that is about two thirds of a millisecond per
layer, at batch 1 a hundred and fifty microseconds of small-op overhead. The kernel reads the
blocks where they lie, one (sequence, KV head) per OpenMP task, and also writes the step's new
K/V, so a decode step's attention is one call per layer.

It is built at first use for this CPU (engine_proc/kernels/extension.py). No compiler, a failed build or
`RILL_CPU_KERNELS=0`: the runner takes the torch backend, which gives the same results within rounding.
"""
from __future__ import annotations

import functools

import torch

from rill.engine_proc.attention.backend import AttentionBackend, StepInputs
from rill.engine_proc.attention.kv_cache import AttentionMetadata, paged_attention, torch_decode
from rill.engine_proc.kernels import extension
from rill.engine_proc.model.step_inputs import prepare_flat_step, prepare_step
from rill.engine_proc.sched.batch import Batch

DTYPES = (torch.float32, torch.bfloat16)


def available() -> bool:
    return extension.available()


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Attention of one query token per row, q [B, H, D], over keys 0..context_lens[b]-1 of row b,
    whose blocks are block_table[b] ([B, width] int64) in k_cache/v_cache [blocks, block_size,
    H_kv, D]. With k_new/v_new [B, H_kv, D] and slot_mapping [B] it first writes them into the
    cache. None when the kernel cannot take these tensors (the caller takes the torch path)."""
    if (q.dtype not in DTYPES or q.device.type != "cpu" or k_cache.dtype != q.dtype
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.stride(-1) != 1
            or q.shape[1] % k_cache.shape[2] or not extension.available()):
        return None
    if k_new is not None and (k_new.stride(-1) != 1 or v_new.stride(-1) != 1 or k_new.dtype != q.dtype):
        return None
    return torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, block_table, context_lens, k_new, v_new, slot_mapping)


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """Causal attention of a prompt chunk q [Tq, H, D] over its keys k, v [Tk, H_kv, D] (the
    chunk's tokens are the last Tq keys), through oneDNN's micro-kernels (csrc/prefill_attention.cpp):
    on a 512-token prompt about a fifth faster than torch's flash attention with AMX, 5x with AVX-512
    BF16 alone (Zen 4). None where it does not apply (neither AMX-BF16 nor AVX-512 BF16, not
    bfloat16, a head dimension not a multiple of 64, under torch.compile): the caller runs SDPA."""
    if (q.dtype != torch.bfloat16 or q.device.type != "cpu" or q.shape[-1] % 64 or k.dtype != q.dtype
            or q.shape[1] % k.shape[1] or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1
            or torch.compiler.is_compiling() or not prefill_supported()):
        return None
    return torch.ops.rill_cpu.prefill_attention(q, k, v)


def prefill_supported() -> bool:
    # Asked only once the kernels are loaded: a call before must not fix the answer at False.
    return extension.loaded() and _prefill_kernel_supported()


@functools.cache
def _prefill_kernel_supported() -> bool:
    return bool(torch.ops.rill_cpu.prefill_attention_supported())


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """kv_cache.write_kv in one C++ call (index_copy_ took 2.5 ms of a 512-token prefill)."""
    torch.ops.rill_cpu.write_kv(k_cache, v_cache, k, v, slot_mapping)


class CpuBackend(AttentionBackend):
    """The C++ decode kernel (in place over the blocks, no gather, no mask) and, in bfloat16 where the
    CPU has AMX or AVX-512 BF16, the C++ prompt kernel beside SDPA; in the compiled decode steps the
    C++ operator rill_cpu::paged_decode_layer (no Python inside the step)."""

    name = "cpu"
    write = staticmethod(write_kv)

    def __init__(self, device: torch.device, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> None:
        super().__init__(device, block_size)
        self.decode_kernel = dtype in DTYPES  # else (float16) torch's decode path
        prompt_kernel = dtype == torch.bfloat16 and prefill_supported()
        self.prefill = _prefill if prompt_kernel else None
        # --kv-cache-dtype int8 (kv_int8.py): the kernels quantize as they write (write_kv, the fused prompt
        # layers' too) and dequantize as they read; a chunk's cached context is read dequantized
        # (kv_int8_gather). A fresh prompt attends to its own K/V as computed, before quantization.
        self.gather = _gather_int8 if kv_cache_dtype == "int8" else None
        self.fused_prompt_layers = prompt_kernel
        self.decode = _decode if self.decode_kernel else torch_decode
        self.graph_decode_op = (torch.ops.rill_cpu.paged_decode_layer if self.decode_kernel
                                else torch.ops.rill.paged_decode_attention)

    def prepare(self, batch: Batch) -> StepInputs:
        return prepare_step(batch, self.block_size, self.device, decode_lens=self.decode_kernel)

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        self.write(k_cache, v_cache, k, v, meta.slot_mapping)
        return paged_attention(q, k, v, k_cache, v_cache, meta, self.decode, self.prefill, self.gather)

    def masked_decode(self, q, k_cache, v_cache, meta, window, softcap, sinks):
        if not self.decode_kernel or not meta.num_decode_tokens:
            return None
        return torch.ops.rill_cpu.paged_decode(q[: meta.num_decode_tokens], k_cache, v_cache, meta.decode_block_table,
                                               meta.decode_lens, None, None, None, window, softcap, sinks)

    def bind_kv_caches(self, kv_cache) -> None:
        # One registry per graph op, each in its op's language: rill_cpu::paged_decode_layer runs
        # inside the compiled step without the interpreter, so it reads a C++ list; a Python op (on
        # a GPU, or without the kernels) reads backend.py's. Each backend fills the one it calls.
        if self.decode_kernel:
            torch.ops.rill_cpu.set_kv_caches(list(kv_cache.k_caches), list(kv_cache.v_caches))
        else:
            super().bind_kv_caches(kv_cache)


class InvariantCpuBackend(AttentionBackend):
    """--batch-invariant on the "cpu" backend: every token, decode or prompt, a row of the C++ decode
    kernel with its own block table and length, so its arithmetic depends on nothing else in the step."""

    name = "batch-invariant-cpu"
    flat = True
    write = staticmethod(write_kv)

    def prepare(self, batch: Batch) -> StepInputs:
        input_ids, positions, meta, logits_indices = prepare_flat_step(batch, self.block_size, self.device)
        meta.decode_block_table = meta.block_tables.index_select(0, meta.seq_of_token).long()
        meta.decode_lens = meta.context_lens.long()
        return input_ids, positions, meta, logits_indices

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        self.write(k_cache, v_cache, k, v, meta.slot_mapping)
        return torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, meta.decode_block_table, meta.decode_lens)

    def masked_decode(self, q, k_cache, v_cache, meta, window, softcap, sinks):
        return torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, meta.decode_block_table, meta.decode_lens, None,
                                               None, None, window, softcap, sinks)


def _decode(q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
    return torch.ops.rill_cpu.paged_decode(q, k_cache, v_cache, meta.decode_block_table, meta.decode_lens)


def _gather_int8(cache, block_table, length, dtype) -> torch.Tensor:
    return torch.ops.rill_cpu.kv_int8_gather(cache, block_table, length, torch.empty(0, dtype=dtype))


def _prefill(q, k, v) -> torch.Tensor | None:
    """prefill() for the model's own q, k, v (bfloat16 like the backend, rows contiguous, never under
    torch.compile): only the head size is left to check."""
    return torch.ops.rill_cpu.prefill_attention(q, k, v) if q.shape[-1] % 64 == 0 else None
