"""Each model step's batch description, from the engine (rank 0) to every other rank process.

Tensor parallelism runs the same step on every rank, so rank 0 must hand its msgpack batch to the
N-1 others every step (10-50 ms apart; 1-50 KB, rarely a few MiB). Two transports, one shape
(`publish(payload)` on rank 0, `recv()` on the others):

- `ShmBroadcast`: the same-machine path. One writer, N readers, a ring of `num_slots` fixed-size
  slots in one /dev/shm segment. Wake-ups go through multiprocessing semaphores, never a busy spin:
  the readers are torch processes that need the cores. Per reader, `filled` counts slots written
  and not yet read, `free` slots it has released; the writer takes one `free` from every reader
  before it writes a slot, so a reader `num_slots` behind holds the writer back (back-pressure)
  instead of losing data. A message larger than a slot goes over consecutive slots, each with a
  (total length, chunk length) header.
- `GlooBroadcast`: torch.distributed broadcasts (the length, then the bytes). The baseline that
  bench/ipc/tp_broadcast.py measures against, and the path between machines.

We use os.open + mmap rather than multiprocessing.shared_memory: the latter's resource tracker
unlinks segments owned by another process at exit (Python < 3.13), as in bench/ipc/shm_ring.py.
"""
from __future__ import annotations

import itertools
import mmap
import os
import struct
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
_SLOT_HEADER = struct.Struct("<QQ")  # the whole message's length, this slot's chunk length
_SLOT_ALIGN = 64  # each slot's header starts on its own cache line
_instance_ids = itertools.count()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _map(path: Path, num_bytes: int, *, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, num_bytes)
        return mmap.mmap(fd, num_bytes)
    finally:
        os.close(fd)


class ShmBroadcastReader:
    """One reader's end: picklable while a spawned `ctx.Process` starts (the semaphores travel only
    then). Every reader sees every message from the first one published."""

    def __init__(self, name: str, index: int, slot_bytes: int, num_slots: int, filled, free):
        self.name, self.index = name, index
        self.slot_bytes, self.num_slots = slot_bytes, num_slots
        self._filled, self._free = filled, free
        self._mm: mmap.mmap | None = self._map()
        self._num_read = 0  # slots consumed; this reader's position in the ring
        self._chunks: list[bytes] = []  # a split message's chunks so far: a timeout mid-message resumes
        self._chunks_len = 0

    def _map(self) -> mmap.mmap:
        return _map(SHM_DIR / self.name, _slot_stride(self.slot_bytes) * self.num_slots, create=False)

    def __getstate__(self) -> dict:
        assert self._num_read == 0, "hand a reader over before it reads"
        return {**self.__dict__, "_mm": None}

    def __setstate__(self, state: dict) -> None:
        # Mapped as the child unpickles its arguments, before its target runs: the segment must
        # still exist then, so the writer closes only after its readers' READY (or their exit).
        self.__dict__.update(state)
        self._mm = self._map()

    def recv(self, timeout: float | None = None) -> bytes:
        """The next message, whole; TimeoutError when none completes within `timeout` seconds."""
        if self._mm is None:
            raise RuntimeError(f"reader {self.index} of {self.name} is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self._filled.acquire(True, _remaining(deadline)):
                raise TimeoutError(f"no message on {self.name} for reader {self.index} within {timeout} s")
            base = (self._num_read % self.num_slots) * _slot_stride(self.slot_bytes)
            total_len, chunk_len = _SLOT_HEADER.unpack_from(self._mm, base)
            start = base + _SLOT_HEADER.size
            chunk = self._mm[start : start + chunk_len]  # a copy: the slot is released next
            self._num_read += 1
            self._free.release()
            if not self._chunks and chunk_len == total_len:
                return chunk  # the common case: the message fits one slot, one copy
            self._chunks.append(chunk)
            self._chunks_len += chunk_len
            if self._chunks_len == total_len:
                message = b"".join(self._chunks)
                self._chunks, self._chunks_len = [], 0
                return message

    def close(self) -> None:
        """Unmap (idempotent); the writer owns the segment and unlinks it."""
        if self._mm is not None:
            self._mm.close()
            self._mm = None


def _slot_stride(slot_bytes: int) -> int:
    return -(-(_SLOT_HEADER.size + slot_bytes) // _SLOT_ALIGN) * _SLOT_ALIGN


class ShmBroadcast:
    """The writer's end, and the segment's owner: `close()` unlinks it."""

    def __init__(self, name: str, num_readers: int, slot_bytes: int, num_slots: int, ctx):
        assert num_readers >= 1 and num_slots >= 1 and slot_bytes >= 1
        self.name, self.path = name, SHM_DIR / name
        self.num_readers, self.slot_bytes, self.num_slots = num_readers, slot_bytes, num_slots
        self._stride = _slot_stride(slot_bytes)
        self._mm: mmap.mmap | None = _map(self.path, self._stride * num_slots, create=True)
        self._filled = [ctx.Semaphore(0) for _ in range(num_readers)]
        self._free = [ctx.Semaphore(num_slots) for _ in range(num_readers)]
        self._num_written = 0  # slots, not messages
        self._broken = False  # a timeout after part of a message went out: the readers would misparse

    @classmethod
    def create(cls, name_prefix: str, num_readers: int, *, ctx, slot_bytes: int = 1 << 20,
               num_slots: int = 4) -> ShmBroadcast:
        """A new segment named `<prefix>_<pid>_<n>`: unique per instance, so two never share one."""
        name = f"{name_prefix}_{os.getpid()}_{next(_instance_ids)}"
        return cls(name, num_readers, slot_bytes, num_slots, ctx)

    def reader(self, index: int) -> ShmBroadcastReader:
        """Reader `index`'s handle, to pass as an argument to the `ctx.Process` that will read."""
        assert 0 <= index < self.num_readers
        return ShmBroadcastReader(self.name, index, self.slot_bytes, self.num_slots,
                                  self._filled[index], self._free[index])

    def publish(self, payload: bytes | bytearray | memoryview, timeout: float | None = None) -> None:
        """Copy `payload` into the ring for every reader; blocks while a reader is `num_slots` slots
        behind. A TimeoutError before the first slot leaves the ring usable; a later one breaks it."""
        if self._mm is None or self._broken:
            raise RuntimeError(f"broadcast {self.name} is {'closed' if self._mm is None else 'broken'}")
        view = memoryview(payload).cast("B")
        total_len, offset = len(view), 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # at least once: an empty message still takes a slot
            chunk = view[offset : offset + self.slot_bytes]
            try:
                self._claim_slot(deadline)
            except TimeoutError:
                self._broken = offset > 0
                raise
            base = (self._num_written % self.num_slots) * self._stride
            _SLOT_HEADER.pack_into(self._mm, base, total_len, len(chunk))
            self._mm[base + _SLOT_HEADER.size : base + _SLOT_HEADER.size + len(chunk)] = chunk
            self._num_written += 1
            for filled in self._filled:
                filled.release()
            offset += len(chunk)
            if offset >= total_len:
                return

    def _claim_slot(self, deadline: float | None) -> None:
        """One `free` from every reader, or none: a timeout gives back those already taken."""
        for i, free in enumerate(self._free):
            if not free.acquire(True, _remaining(deadline)):
                for taken in self._free[:i]:
                    taken.release()
                raise TimeoutError(f"reader {i} of {self.name} is {self.num_slots} slots behind")

    def close(self) -> None:
        """Unmap and unlink the segment (idempotent). Readers that mapped it keep their mapping."""
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self.path.unlink(missing_ok=True)


class GlooBroadcast:
    """The same publish/recv over an initialised torch.distributed group: an int64 length, then the
    bytes as uint8. `src` is a global rank; every rank in `group` must make the matching call."""

    def __init__(self, group=None, src: int = 0):
        import torch  # here, not at the top: ShmBroadcast's users need not load torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.group, self.src = group, src

    def publish(self, payload: bytes | bytearray) -> None:
        torch = self._torch
        self._dist.broadcast(torch.tensor([len(payload)], dtype=torch.int64), self.src, self.group)
        if payload:  # torch.frombuffer refuses an empty buffer; the receivers skip it too
            # A bytearray goes as is; bytes are copied, since torch warns on a read-only buffer.
            writable = payload if isinstance(payload, bytearray) else bytearray(payload)
            self._dist.broadcast(torch.frombuffer(writable, dtype=torch.uint8), self.src, self.group)

    def recv(self) -> bytes:
        torch = self._torch
        length = torch.empty(1, dtype=torch.int64)
        self._dist.broadcast(length, self.src, self.group)
        if not int(length):
            return b""
        data = torch.empty(int(length), dtype=torch.uint8)
        self._dist.broadcast(data, self.src, self.group)
        return data.numpy().tobytes()
