"""The spill thread: blocks copied out of the KV cache are encoded and written here, never on the busy loop."""
from __future__ import annotations

import logging
import queue
import threading
import zlib

import torch

from rill.engine_proc.kv_disk.store import BlockHeader, BlockStore
from rill.engine_proc.sched.prefix_cache import CachedBlock

log = logging.getLogger("rill.engine")


def block_bytes(blocks: torch.Tensor, j: int):
    """Block j of a read_blocks() copy ([num_tensors, 2, n, ...]) as contiguous bytes (a numpy uint8 array)."""
    return blocks[:, :, j].contiguous().cpu().reshape(-1).view(torch.uint8).numpy()


def header_of(block: CachedBlock, payload, dtype: torch.dtype, shape: list[int]) -> BlockHeader:
    return BlockHeader(block.block_hash, block.parent_hash, block.depth, list(block.token_ids), block.root_key[2],
                       str(dtype).removeprefix("torch."), shape, len(payload), zlib.crc32(payload))


def write_blocks(store: BlockStore, blocks: list[CachedBlock], data: torch.Tensor, stamps_ns: list[int] | None = None) -> int:
    """Writes each block of a read_blocks() copy; the number written."""
    shape = [data.shape[0], data.shape[1], *data.shape[3:]]
    num_written = 0
    for j, block in enumerate(blocks):
        if block.block_hash in store:
            continue
        payload = block_bytes(data, j)
        num_written += store.write(header_of(block, payload, data.dtype, shape), payload,
                                   None if stamps_ns is None else stamps_ns[j])
    return num_written


class SpillWriter(threading.Thread):
    """Writes what `spill()` hands it. Bounded in bytes queued: past `max_queued_bytes` a spill is dropped (the
    blocks are lost to the disk tier, not to anyone's request) rather than the busy loop kept waiting."""

    def __init__(self, store: BlockStore, max_queued_bytes: int = 256 << 20) -> None:
        super().__init__(name="kv-disk-writer", daemon=True)
        self.store = store
        self.max_queued_bytes = max_queued_bytes
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._queued_bytes = 0  # written by both threads: a bound, not an account, so a race costs nothing
        self.num_written = 0
        self.num_dropped = 0
        self.start()

    def has_room(self, num_bytes: int) -> bool:
        return self._queued_bytes + num_bytes <= self.max_queued_bytes

    def idle(self) -> bool:
        """Everything handed to it is written (or failed)."""
        return self._queued_bytes == 0 and self._queue.empty()

    def spill(self, blocks: list[CachedBlock], data: torch.Tensor) -> bool:
        """Queues a read_blocks() copy of `blocks`; False (dropped) when the queue is full."""
        num_bytes = data.numel() * data.element_size()
        if not self.has_room(num_bytes):
            self.num_dropped += len(blocks)
            return False
        self._queued_bytes += num_bytes
        self._queue.put((blocks, data, num_bytes))
        return True

    def touch(self, block_hashes: list[int]) -> None:
        """Marks blocks already on disk as used now (an evicted block that was reloaded or spilled before)."""
        self._queue.put((block_hashes, None, 0))

    def close(self, timeout_s: float) -> None:
        """Writes what is queued, for at most `timeout_s`; what is left then is dropped."""
        self._queue.put(None)
        self.join(timeout_s)

    def run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            blocks, data, num_bytes = item
            try:
                if data is None:
                    for block_hash in blocks:
                        self.store.touch(block_hash)
                else:
                    self.num_written += write_blocks(self.store, blocks, data)
            except Exception:  # noqa: BLE001  (a full disk, a bug: the tier is a cache, serving goes on)
                log.exception("--kv-cache-disk: writing %d blocks failed", len(blocks))
            finally:
                self._queued_bytes -= num_bytes
            del item, data
