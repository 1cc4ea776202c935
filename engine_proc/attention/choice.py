"""Which attention backend a runner takes, chosen once from device, dtype, flags and CPU features."""
from __future__ import annotations

import torch

from rill.engine_proc.attention import cpu
from rill.engine_proc.attention.backend import AttentionBackend, InvariantBackend, TorchBackend, TritonBackend

ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """--attention-backend's value made concrete: "auto" is Triton on a GPU, on the CPU the C++
    kernels where they are built, else torch."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {name!r}: expected one of {ATTENTION_BACKENDS}")
    if name == "auto":
        if device.type == "cuda":
            return "triton"
        return "cpu" if cpu.available() else "torch"
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"attention backend 'cpu' runs on the CPU, not on {device.type}")
        if not cpu.available():
            raise ValueError("attention backend 'cpu' needs its C++ kernel, which could not be built here "
                             "(see the warning above); use --attention-backend torch")
    return name


def create_attention_backend(name: str, device: torch.device, dtype: torch.dtype, block_size: int,
                             batch_invariant: bool = False, kv_cache_dtype: str = "auto") -> AttentionBackend:
    """The backend of a resolved name (resolve_attention_backend), chosen once per runner.

    --batch-invariant: on the "cpu" backend every token, decode or prompt, goes through the C++
    kernel as a row of its own (its arithmetic depends on nothing else in the step); on "torch"
    the padded torch path; Triton has no batch-invariant form. --kv-cache-dtype int8: the "cpu"
    backend's kernels alone read and write an int8 cache (kv_int8.py), batch-invariant or not."""
    if kv_cache_dtype == "int8" and (name != "cpu" or dtype not in cpu.DTYPES):
        raise ValueError(f"--kv-cache-dtype int8 needs the cpu attention backend (Rill's C++ kernels) in float32 or "
                         f"bfloat16, not the {name} backend in {str(dtype).removeprefix('torch.')}")
    if name == "triton":
        if batch_invariant:
            raise ValueError("--batch-invariant is implemented for the torch attention path only")
        return TritonBackend(device, block_size)
    if name == "cpu" and batch_invariant and dtype in cpu.DTYPES:
        return cpu.InvariantCpuBackend(device, block_size)
    if batch_invariant:
        return InvariantBackend(device, block_size)
    if name == "cpu":
        return cpu.CpuBackend(device, block_size, dtype, kv_cache_dtype)
    return TorchBackend(device, block_size)
