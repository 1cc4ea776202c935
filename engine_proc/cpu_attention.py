"""Paged decode attention on the CPU: a small C++ kernel (csrc/paged_decode.cpp), built for this CPU.

The torch path gathers each row's K/V blocks into a contiguous copy, then runs SDPA with a mask
over the longest context in the step: at batch 32 that is about two thirds of a millisecond per
layer, at batch 1 a hundred and fifty microseconds of small-op overhead. The kernel reads the
blocks where they lie, one (sequence, KV head) per OpenMP task, and also writes the step's new
K/V, so a decode step's attention is one call per layer.

It is compiled at first use with the system's C++ compiler (`-O3 -march=native`, about a second;
Inductor needs the same compiler) into Rill's cache folder, one file per source, flags and CPU,
and loaded with ctypes. No compiler, a failed build or `RILL_CPU_KERNELS=0`: `paged_decode`
returns None and callers take the torch path, which gives the same results within rounding.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger("rill.model")

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"
# Reassociation lets the compiler vectorise the dot products and sums; no -ffast-math, whose
# start-up code would set flush-to-zero for the whole process.
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
            "-fno-signed-zeros", "-shared", "-fPIC"]
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _library_path(compiler: str) -> Path:
    from engine_proc.bundled_model import default_cache_dir
    from engine_proc.cpu_features import cpu_info

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    info = cpu_info()
    key = hashlib.sha256("\n".join([SOURCE.read_text(), " ".join(CXXFLAGS), version, info.model,
                                    " ".join(sorted(info.flags))]).encode()).hexdigest()[:16]
    return default_cache_dir() / "kernels" / f"paged_decode-{key}.so"


def _build(compiler: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        subprocess.run([compiler, *CXXFLAGS, str(SOURCE), "-o", str(out)], check=True, capture_output=True,
                       text=True, timeout=300)
        os.replace(out, path)  # atomic: another engine building the same file sees it whole


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The loaded kernel library, built first if needed; None where it cannot be had."""
    if os.environ.get("RILL_CPU_KERNELS", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        log.warning("no C++ compiler found: decode attention takes the slower torch path")
        return None
    try:
        path = _library_path(compiler)
        if not path.exists():
            _build(compiler, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or e
        log.warning("the CPU attention kernel could not be built (%s): decode attention takes the torch path",
                    str(detail).strip()[-500:])
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.rill_paged_decode.argtypes = [ctypes.c_int, ptr, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, ptr,
                                      ptr, ptr, i64, ptr, i64, i64, i64, i64, i64, ctypes.c_float]
    lib.rill_paged_decode.restype = ctypes.c_int
    lib.rill_omp_max_threads.restype = ctypes.c_int
    return lib


def available() -> bool:
    return kernel() is not None


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
    lib = kernel()
    code = DTYPE_CODES.get(q.dtype)
    if (lib is None or code is None or q.device.type != "cpu" or k_cache.dtype != q.dtype
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.stride(-1) != 1):
        return None
    if k_new is not None and (k_new.stride(-1) != 1 or v_new.stride(-1) != 1 or k_new.dtype != q.dtype):
        return None
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    table = block_table.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype)
    writes = k_new is not None
    slots = slot_mapping.to(torch.int64).contiguous() if writes else None
    status = lib.rill_paged_decode(
        code, out.data_ptr(), q.data_ptr(), q.stride(0), q.stride(1),
        k_new.data_ptr() if writes else None, k_new.stride(0) if writes else 0, k_new.stride(1) if writes else 0,
        v_new.data_ptr() if writes else None, v_new.stride(0) if writes else 0, v_new.stride(1) if writes else 0,
        k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr() if writes else None, table.data_ptr(),
        table.stride(0), lens.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim, block_size,
        head_dim**-0.5)
    return out if status == 0 else None
