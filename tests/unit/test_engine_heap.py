"""The engine process's start-up heap leaves the garbage collector's view (engine_proc/main.py)."""
from __future__ import annotations

import gc
import time

from rill.engine_proc.main import freeze_startup_heap


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
