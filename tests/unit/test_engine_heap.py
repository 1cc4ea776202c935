"""The engine process's start-up heap leaves the garbage collector's view (engine_proc/main.py); its KV cache's
storage is resident from the start (engine_proc/model/memory.py)."""
from __future__ import annotations

import gc
import time

import torch

from rill.engine_proc.main import freeze_startup_heap
from rill.engine_proc.model.memory import resident_zeros


def test_a_full_collection_no_longer_walks_the_startup_heap():
    heap = [[i] for i in range(200_000)]  # a start-up's worth of long-lived containers
    frozen_before = gc.get_freeze_count()
    try:
        start = time.perf_counter()
        gc.collect()
        walked = time.perf_counter() - start
        freeze_startup_heap()
        assert gc.get_freeze_count() >= frozen_before + len(heap)
        start = time.perf_counter()
        gc.collect()
        # A ratio within this test: the frozen objects are skipped, so the collection is much shorter.
        assert time.perf_counter() - start < walked / 3
    finally:
        gc.unfreeze()


def rss_anon_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


def test_the_kv_caches_zeros_are_resident_from_the_start_and_stay_mapped():
    """resident_zeros (the CPU KV cache's storage): zeros of the shape and dtype, every page resident when it
    returns (a machine short of memory fails the start, not a step), and usable after the call returns (the
    tensor keeps its mapping)."""
    shape = (2, 64, 16, 4, 64, 32)  # 32 MiB of bfloat16
    before = rss_anon_kib()
    cache = resident_zeros(shape, torch.bfloat16)
    grown = rss_anon_kib() - before
    nbytes = cache.numel() * cache.element_size()
    assert cache.shape == shape and cache.dtype == torch.bfloat16 and cache.is_contiguous()
    assert grown * 1024 >= 0.9 * nbytes, (grown, nbytes)
    gc.collect()
    cache[1, 63].fill_(3.0)
    assert cache.float().sum().item() == 3.0 * 16 * 4 * 64 * 32 and cache[0].abs().sum().item() == 0
    assert resident_zeros((0, 4), torch.int8).shape == (0, 4)
