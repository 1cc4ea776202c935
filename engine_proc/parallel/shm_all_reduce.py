"""The all-reduce of ranks on one node, through shared memory instead of gloo's sockets.

A gloo all-reduce of a decode step's few KB costs about half a millisecond on a small CPU (two
socket round trips and gloo's own threads), and a Llama layer needs two: 60 a step for the bundled
model, more than the step's own work (bench/results/tensor_parallel-cpu.md). Here each rank copies
its partial sums into its slot of one /dev/shm segment, tells each peer through a semaphore of
that pair, waits for one word from each peer, and adds the slots in rank order. Every rank adds
the same numbers in the same order, so every rank holds the same bits.

Two sets of slots alternate by call: a rank can be at most one call ahead of any peer (it needs
the peer's part to finish a call), so it never overwrites a slot a peer is still reading. The
per-pair semaphores keep each peer's words in call order. A tensor larger than a slot goes to gloo
(every rank sees the same shape, so all of them do).
"""
from __future__ import annotations

import itertools
import mmap
import os
from pathlib import Path

import torch

SHM_DIR = Path("/dev/shm")
_ids = itertools.count()


class ShmAllReduce:
    """Create on rank 0 before the ranks start; pass the object to each (it pickles with its
    semaphores while a spawned process starts); call `attach(rank)` in each, then `all_reduce`."""

    def __init__(self, world_size: int, ctx, slot_bytes: int = 4 << 20) -> None:
        self.world_size, self.slot_bytes = world_size, slot_bytes
        self.name = f"rill-tp-ar_{os.getpid()}_{next(_ids)}"
        # sems[dst][src]: src's parts ready for dst, one release per call.
        self.sems = [[ctx.Semaphore(0) if src != dst else None for src in range(world_size)]
                     for dst in range(world_size)]
        fd = os.open(SHM_DIR / self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, 2 * world_size * slot_bytes)
        finally:
            os.close(fd)
        self.rank = -1
        self._mm = None
        self._calls = 0

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_mm", "_bytes")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _mm=None)

    def attach(self, rank: int) -> None:
        """Map the segment in this process as `rank` (rank 0 unlinks it once all have joined)."""
        fd = os.open(SHM_DIR / self.name, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, 2 * self.world_size * self.slot_bytes)
        finally:
            os.close(fd)
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.rank = rank

    def unlink(self) -> None:
        (SHM_DIR / self.name).unlink(missing_ok=True)

    def fits(self, x: torch.Tensor) -> bool:
        return self._mm is not None and x.device.type == "cpu" and x.numel() * x.element_size() <= self.slot_bytes

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `x`, a new tensor (the same bits on every rank)."""
        num_bytes = x.numel() * x.element_size()
        first = (self._calls % 2) * self.world_size
        self._calls += 1
        slots = [self._bytes[(first + r) * self.slot_bytes:(first + r) * self.slot_bytes + num_bytes]
                 .view(x.dtype).view(x.shape) for r in range(self.world_size)]
        slots[self.rank].copy_(x)
        for dst in range(self.world_size):
            if dst != self.rank:
                self.sems[dst][self.rank].release()
        for src in range(self.world_size):
            if src != self.rank:
                self.sems[self.rank][src].acquire()
        out = slots[0].clone()
        for part in slots[1:]:
            out += part
        return out
