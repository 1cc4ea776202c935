"""What the engine's memory holds: the model's weights as loaded, and the process's resident set now."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
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
