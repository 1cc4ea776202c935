"""A single-producer single-consumer ring of int32 values in a named /dev/shm segment.

The shared-memory alternative that bench/ipc/ipc_bench.py measures against plain ZeroMQ frames.
It is not on the serving path: it cost more for prompts, the same for decode steps, and no
less than raw bytes inline for top-k logprobs (bench/results/ipc_bench-cpu.md).

The producer writes an array and sends its `ShmSlice` (stream position, count) in a ZeroMQ
message; the consumer copies the ids out and advances the shared read cursor. Positions grow
forever (int64) and are reduced modulo the capacity, so "full" is `head - tail > capacity`.
ZeroMQ delivers the slices in order, so the consumer always releases in order.

We use os.open + mmap rather than multiprocessing.shared_memory: the latter's resource tracker
unlinks segments owned by another process at exit (Python < 3.13).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import msgspec
import numpy as np


class ShmSlice(msgspec.Struct, array_like=True, gc=False):
    """Where an int32 array lies in a ring: stream position and element count."""

    pos: int
    num_ids: int

SHM_DIR = Path("/dev/shm")
_HEADER_BYTES = 64  # the read cursor (int64) on its own cache line
_ITEM_BYTES = 4


class ShmRing:
    """One direction of token-id traffic between two processes."""

    def __init__(self, name: str, capacity_ids: int, *, create: bool):
        self.name = name
        self.path = SHM_DIR / name
        self.capacity_ids = capacity_ids
        self._owner = create
        num_bytes = _HEADER_BYTES + capacity_ids * _ITEM_BYTES
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, num_bytes)
            self._mm = mmap.mmap(fd, num_bytes)
        finally:
            os.close(fd)
        self._tail = np.frombuffer(self._mm, dtype=np.int64, count=1, offset=0)
        self._data = np.frombuffer(self._mm, dtype=np.int32, count=capacity_ids, offset=_HEADER_BYTES)
        self._head = 0  # producer-local write position

    # ---- producer -----------------------------------------------------------------------

    def write(self, ids) -> ShmSlice | None:
        """Copy ids into the ring; None when they do not fit now (the caller sends them inline)."""
        num_ids = len(ids)
        if num_ids == 0:
            return ShmSlice(self._head, 0)
        pos = self._head
        offset = pos % self.capacity_ids
        if offset + num_ids > self.capacity_ids:  # never split an array: skip to the next lap
            pos += self.capacity_ids - offset
            offset = 0
        if pos + num_ids - int(self._tail[0]) > self.capacity_ids:
            return None
        self._data[offset : offset + num_ids] = ids
        self._head = pos + num_ids
        return ShmSlice(pos, num_ids)

    # ---- consumer -----------------------------------------------------------------------

    def read(self, where: ShmSlice) -> np.ndarray:
        """Copy the ids out and release their space to the producer."""
        offset = where.pos % self.capacity_ids
        ids = self._data[offset : offset + where.num_ids].copy()
        self._tail[0] = where.pos + where.num_ids
        return ids

    def close(self) -> None:
        self._tail = self._data = None  # drop the views before closing the map
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view; the map goes with the process
            pass
        if self._owner:
            self.path.unlink(missing_ok=True)


def segment_name(run_id: str, role: str) -> str:
    """Segments of one run share the prefix `rill_<run_id>_`, so a sweep can find them."""
    return f"rill_{run_id}_{role}"

