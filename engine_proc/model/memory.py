"""What the engine's memory holds: the model's weights as loaded, and the process's resident set now."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import mmap
import os

import torch
from torch import nn


def weight_bytes(model: nn.Module | None) -> int:
    """Bytes of every tensor the model holds: its parameters and buffers, and tensors kept as plain
    attributes (a prepacked or quantized linear's weight), each storage counted once."""
    if model is None:
        return 0
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False),
                   *(v for v in vars(module).values() if isinstance(v, torch.Tensor))]
        for t in tensors:
            try:
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # an opaque (mkldnn) tensor: its logical size
                key, size = id(t), t.numel() * t.element_size()
            if key not in seen and t.device.type != "meta":
                seen.add(key)
                total += size
    return total


def empty_like_on(model: nn.Module, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """`model.to(dtype).to_empty(device=device)` for a model built on the meta device: uninitialised storage for each
    parameter and buffer, floating ones in `dtype`, a tensor shared between modules still shared. to_empty's
    empty_like on meta tensors runs torch's Python meta kernels, whose first use imports sympy and torch._decomp:
    0.35 s of each engine's start."""
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id: (the meta tensor, kept so its id stays its own; new)

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            new = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device)
            made[id(t)] = (t, nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new)
        return made[id(t)][1]

    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for name, t in tensors.items():
                if t is not None:
                    tensors[name] = empty(t)
    return model


def resident_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """torch.zeros, but on the CPU in an anonymous mapping of its own, on ordinary pages, each page touched
    now (by torch's threads): resident from the start, so an engine short of memory fails at start, not
    under load. torch.zeros would put a tensor this large on huge pages under THP_MEM_ALLOC_ENABLE (the
    engine's default), whose first touch costs several times as much where the kernel must compact memory
    for them: a 1 GiB KV cache took 1.6 s against 0.36 s on a 2-core VM. Attention over the cache reads about 4%
    slower from ordinary pages (28 layers over 32 x 2,048 tokens: 208.7 against 201.3 ms, within this VM's spread;
    bench/results/kv_pages-zen4.md)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    # Private and anonymous (Python's default is shared: shmem, not counted as the process's own): zero pages,
    # kept mapped by the tensor.
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape).zero_()


def resident_bytes() -> int:
    """This process's resident set size now (Linux: /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_free_heap() -> int:
    """Hands the free pages of malloc's heap back to the system (glibc's malloc_trim). Loading a model
    frees much (float copies made before packing or quantizing, the loader's buffers) that malloc keeps
    for later, and the resident set counts it. Returns the bytes the resident set fell by (0 where the C
    library has no malloc_trim)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return 0
    before = resident_bytes()
    gc.collect()  # the loader's and the compiler's cyclic garbage first
    trim(0)
    return max(0, before - resident_bytes())
