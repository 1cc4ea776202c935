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
                             batch_invariant: bool = False) -> AttentionBackend:
    """The backend of a resolved name (resolve_attention_backend), chosen once per runner.

    --batch-invariant: on the "cpu" backend every token, decode or prompt, goes through the C++
    kernel as a row of its own (its arithmetic depends on nothing else in the step); on "torch"
    the padded torch path; Triton has no batch-invariant form."""
    if name == "triton":
        if batch_invariant:
            raise ValueError("--batch-invariant is implemented for the torch attention path only")
        return TritonBackend(device, block_size)
    if name == "cpu" and batch_invariant and dtype in cpu.DTYPES:
        return cpu.InvariantCpuBackend(device, block_size)
    if batch_invariant:
        return InvariantBackend(device, block_size)
    if name == "cpu":
        return cpu.CpuBackend(device, block_size, dtype)
    return TorchBackend(device, block_size)
