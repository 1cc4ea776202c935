"""A lock beside a cache entry, so that processes starting together make it once."""
from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path


@contextlib.contextmanager
def cache_lock(lock_path: Path):
    """An exclusive flock on `lock_path`, so that processes starting together make a cache entry once (the
    kernels' build, a GGUF's conversion); the system releases it if its holder dies."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
