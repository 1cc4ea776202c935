"""The disk tier between the prefix cache and a BlockStore: spills evicted blocks, reloads the hottest at start."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from rill.engine_proc.kv_disk.identity import identity_folder, lock_folder, model_identity
from rill.engine_proc.kv_disk.store import BlockHeader, BlockStore
from rill.engine_proc.kv_disk.writer import SpillWriter, write_blocks
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.prefix_cache import CachedBlock

log = logging.getLogger("rill.engine")

RELOAD_BUDGET_S = 30.0  # at most this long reading blocks back before READY; the rest stays on disk
CLOSE_BUDGET_S = 4.0  # at a clean stop: the launcher kills an engine that has not stopped in 10 s
_BATCH = 64  # blocks per copy out of (or into) the KV cache
IDLE_BATCH = 32  # blocks an idle busy loop hands the spill thread at a time


def block_layout(kv_cache, device) -> tuple[torch.dtype, list[int]]:
    """(dtype, shape) of one block as read_blocks() copies it: [num_tensors, 2, block_size, ...]."""
    probe = kv_cache.read_blocks(torch.zeros(1, dtype=torch.long, device=device))  # the null block
    return probe.dtype, [probe.shape[0], probe.shape[1], *probe.shape[3:]]


def spillable(block: CachedBlock) -> bool:
    """An adapter's blocks are not kept: their root hashes a str, which differs in the next process (and its
    load id starts again), so they could never be found there. The base model's, salted or not, are."""
    return not block.root_key[0]


class DiskTier:
    """Evicted blocks go to disk (`spill_evicted`, on the busy loop, between schedule() and the step that
    overwrites them: one copy out of the KV cache, the writing on the spill thread); while the engine is idle the
    cached blocks follow, hottest first (`spill_idle`); at a clean stop the hottest still missing follow
    (`close`); at start the hottest on disk come back (`reload`)."""

    def __init__(self, store: BlockStore, kv_cache, blocks: BlockManager, device: torch.device | str = "cpu",
                 lock_fd: int | None = None) -> None:
        self.store = store
        self.kv_cache = kv_cache
        self.blocks = blocks
        self.cache = blocks.prefix_cache
        self._device = device
        self.dtype, self.block_shape = block_layout(kv_cache, device)
        self.lock_fd = lock_fd  # lock_folder()'s: held while this engine lives
        self.writer: SpillWriter | None = None
        self.num_reloaded = 0
        self._idle_seen = 0  # the prefix cache's num_registered when an idle spill last found nothing left
        self._idle_queued: set[int] = set()  # hashes an idle spill queued, until the spill thread is idle again

    def start(self) -> None:
        """From now on evictions are recorded and spilled (after reload: its blocks are on disk already)."""
        self.cache.evicted = []
        self.writer = SpillWriter(self.store)

    # ---- spill ------------------------------------------------------------------------------------

    def spill_evicted(self) -> None:
        """The blocks schedule() evicted, copied out before the model step overwrites them."""
        evicted = self.cache.take_evicted()
        if not evicted:
            return
        fresh = [(block_id, block) for block_id, block in evicted if spillable(block) and block.block_hash not in self.store]
        if len(fresh) < len(evicted):  # kept already: used again, so the disk keeps them longer
            self.writer.touch([b.block_hash for _, b in evicted if spillable(b) and b.block_hash in self.store])
        for start in range(0, len(fresh), _BATCH):
            part = fresh[start : start + _BATCH]
            if not self.writer.has_room(len(part) * self._block_bytes()):
                self.writer.num_dropped += len(fresh) - start
                return
            data = self.kv_cache.read_blocks(self._ids([block_id for block_id, _ in part]))
            self.writer.spill([block for _, block in part], data)

    def has_idle_work(self) -> bool:
        """Has the prefix cache entered blocks since the last idle spill found nothing left to write?"""
        return self.writer is not None and self.cache.num_registered != self._idle_seen

    def spill_idle(self) -> None:
        """While the engine has nothing else to do: the next IDLE_BATCH hottest cached blocks the disk lacks, to the
        spill thread. So a stop has little left to write in its 4 s, and a crash loses little."""
        if not self.writer.has_room(IDLE_BATCH * self._block_bytes()):
            time.sleep(0.005)  # the spill thread is behind: let it write (an input wakes the loop within 5 ms)
            return
        if self.writer.idle():
            self._idle_queued.clear()  # all written: in the store now
        seen = self.cache.num_registered
        part = []
        for block_id, block in self.cache.hottest(self.blocks.ref_counts):
            if spillable(block) and block.block_hash not in self.store and block.block_hash not in self._idle_queued:
                part.append((block_id, block))
                if len(part) == IDLE_BATCH:
                    break
        if len(part) < IDLE_BATCH:
            self._idle_seen = seen  # every cached block is on disk or on its way
        if part:
            self.writer.spill([block for _, block in part], self.kv_cache.read_blocks(self._ids([i for i, _ in part])))
            self._idle_queued.update(block.block_hash for _, block in part)

    def close(self, budget_s: float = CLOSE_BUDGET_S) -> None:
        """A clean stop: the queued spills, then the hottest blocks still cached that the disk lacks, within budget_s."""
        deadline = time.monotonic() + budget_s
        if self.writer is not None:
            self.writer.close(budget_s / 2)
        hot = [(i, b) for i, b in self.cache.hottest(self.blocks.ref_counts) if spillable(b)]
        now_ns, num_written, num_bytes = time.time_ns(), 0, 0
        stamps = {b.block_hash: now_ns - rank * 1000 for rank, (_, b) in enumerate(hot)}  # the hottest newest
        missing = [(i, b) for i, b in hot if b.block_hash not in self.store]
        for _, block in hot:
            if block.block_hash in self.store:
                self.store.touch(block.block_hash, stamps[block.block_hash])
        for start in range(0, len(missing), _BATCH):
            if time.monotonic() > deadline or num_bytes >= self.store.max_bytes:
                break
            part = missing[start : start + _BATCH]
            data = self.kv_cache.read_blocks(self._ids([block_id for block_id, _ in part]))
            blocks = [block for _, block in part]
            num_written += write_blocks(self.store, blocks, data, [stamps[b.block_hash] for b in blocks])
            num_bytes += len(part) * self._block_bytes()
        written = self.writer.num_written if self.writer is not None else 0
        dropped = self.writer.num_dropped if self.writer is not None else 0
        log.info("--kv-cache-disk: %d blocks spilled while serving (%d dropped), %d of %d cached at stop; "
                 "%d blocks (%.0f MiB) on disk", written, dropped, num_written, len(hot), len(self.store),
                 self.store.num_bytes / 2**20)

    # ---- reload ------------------------------------------------------------------------------------

    def reload(self, budget_s: float = RELOAD_BUDGET_S) -> int:
        """The hottest chains on disk into free blocks, as cached, evictable blocks: each with every block
        before it in its prompt (a block is found only through its parent), as many as the free blocks hold."""
        deadline = time.monotonic() + budget_s
        capacity = self.blocks.num_free_blocks()
        chosen: dict[int, CachedBlock] = {}
        for block_hash in self.store.hottest():
            if len(chosen) >= capacity or time.monotonic() > deadline:
                break
            path = self._path_to_root(block_hash, chosen)
            if path is not None and len(chosen) + len(path) <= capacity:
                chosen.update((b.block_hash, b) for b in path)
        ordered = sorted(chosen.values(), key=lambda b: b.depth)  # parents first
        for start in range(0, len(ordered), _BATCH):
            if time.monotonic() > deadline:
                break
            self._load(ordered[start : start + _BATCH])
        log.info("--kv-cache-disk %s: %d blocks reloaded into the prefix cache (of %d on disk, %.0f MiB)",
                 self.store.folder, self.num_reloaded, len(self.store), self.store.num_bytes / 2**20)
        return self.num_reloaded

    def _path_to_root(self, block_hash: int, chosen: dict[int, CachedBlock]) -> list[CachedBlock] | None:
        """The block and its ancestors not chosen yet; None when one is missing or unreadable."""
        path = []
        while block_hash not in chosen:
            header = self.store.read_header(block_hash) if block_hash in self.store else None
            if header is None or not self._fits(header):
                return None
            path.append(header.block())
            if header.depth == 0:
                break
            block_hash = header.parent_hash
        return path

    def _fits(self, header: BlockHeader) -> bool:
        return header.dtype == str(self.dtype).removeprefix("torch.") and header.shape == self.block_shape

    def _load(self, part: list[CachedBlock]) -> None:
        read = [(block, self.store.read(block.block_hash)) for block in part]
        good = [(block, got[1]) for block, got in read if got is not None and got[0].block() == block]
        block_ids = self.blocks.adopt_cached([block for block, _ in good])
        kept = [(block_id, payload) for block_id, (_, payload) in zip(block_ids, good) if block_id is not None]
        if not kept:
            return
        tensors = [torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(self.dtype).view(self.block_shape)
                   for _, payload in kept]
        data = torch.stack(tensors, dim=2).to(self._device)
        self.kv_cache.write_blocks(self._ids([block_id for block_id, _ in kept]), data)
        self.num_reloaded += len(kept)

    def _ids(self, block_ids: list[int]) -> torch.Tensor:
        return torch.tensor(block_ids, dtype=torch.long, device=self._device)

    def _block_bytes(self) -> int:
        size = self.dtype.itemsize
        for n in self.block_shape:
            size *= n
        return size


def open_disk_tier(config, rank: int, runner, blocks: BlockManager, dtype_name: str) -> DiskTier:
    """--kv-cache-disk for this engine: its folder (by model identity; per rank under --data-parallel-size),
    locked, reloaded into `blocks`' prefix cache, spilling from now on. ValueError where it cannot serve."""
    from rill.engine_proc.model.runner import ModelRunner

    if not isinstance(runner, ModelRunner):
        raise ValueError("--kv-cache-disk needs the native runner (a Llama-family model, --model-impl native)")
    if blocks.prefix_cache is None:
        raise ValueError("--kv-cache-disk needs prefix caching: the blocks on disk are the prefix cache's")
    if blocks.window is not None or runner.drafter is not None:
        raise ValueError("--kv-cache-disk is not served with window tables or a draft model (their KV lives elsewhere)")
    model = config.model
    kv_dtype, shape = block_layout(runner.kv_cache, runner.device)
    identity = model_identity(model.model_dir, dtype=dtype_name, block_size=model.block_size,
                              block_layout=(str(kv_dtype).removeprefix("torch."), shape),
                              load_format=model.load_format, quantization=model.quantization)
    multi = config.parallel.data_parallel_size > 1
    folder = identity_folder(Path(config.kv_cache_disk), identity, rank if multi else None)
    lock_fd = lock_folder(folder)  # before the store clears temporary files: another engine's may be in flight
    tier = DiskTier(BlockStore(folder, config.kv_cache_disk_bytes), runner.kv_cache, blocks, runner.device, lock_fd)
    tier.reload()
    tier.start()
    return tier
