"""A folder of KV blocks, one file each, named by block hash: written whole or not at all, checked on read, LRU in bytes."""
from __future__ import annotations

import os
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path

import msgspec

from rill.engine_proc.sched.prefix_cache import CachedBlock

MAGIC = b"RILLKVB1"  # the file format's name and version: a file with other leading bytes is not read
SUFFIX = ".kvb"
_LEN_BYTES = 4  # the header's length, little-endian, after the magic


class BlockHeader(msgspec.Struct, array_like=True, frozen=True):
    """What precedes a block's KV in its file: how to find the block again, and how to check its bytes."""

    block_hash: int
    parent_hash: int
    depth: int
    token_ids: list[int]
    cache_salt: bytes
    dtype: str  # of the KV tensor, as torch names it
    shape: list[int]  # of one block: [num_tensors, 2, block_size, ...]
    num_bytes: int
    crc32: int

    def block(self) -> CachedBlock:
        return CachedBlock(self.block_hash, self.parent_hash, self.depth, tuple(self.token_ids), ("", 0, self.cache_salt))


_encode = msgspec.msgpack.Encoder().encode
_decode_header = msgspec.msgpack.Decoder(BlockHeader).decode


def file_name(block_hash: int) -> str:
    return f"{block_hash & 0xFFFF_FFFF_FFFF_FFFF:016x}{SUFFIX}"


class BlockStore:
    """Files `<hash>.kvb` under `folder`, at most `max_bytes` of them: past it the least recently used go.

    A file is written under a temporary name and renamed into place, so a crash leaves either the whole
    file or none (temporary leftovers are removed at open). Without fsync a power loss can still leave a
    short or zeroed file under its name: every read checks the magic, the length and a CRC-32 of the KV,
    and a file that fails is deleted and never served. Recency is the file's mtime, which a write or a
    touch sets: it survives the restart that the folder is for.

    One writer at a time (the spill thread, or the engine itself when that thread is stopped); the index
    is guarded by a lock so that the busy loop can ask `in` meanwhile.
    """

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._sizes: OrderedDict[int, int] = OrderedDict()  # hash -> file size, least recently used first
        self.num_bytes = 0
        self.num_evicted = 0
        folder.mkdir(parents=True, exist_ok=True)
        found = []
        for path in folder.iterdir():
            if ".tmp" in path.name:
                path.unlink(missing_ok=True)  # a write a crash cut short
            elif path.suffix == SUFFIX:
                try:
                    stat = path.stat()
                    block_hash = int(path.stem, 16)
                except (OSError, ValueError):
                    continue
                found.append((stat.st_mtime_ns, _signed(block_hash), stat.st_size))
        for _, block_hash, size in sorted(found):
            self._sizes[block_hash] = size
            self.num_bytes += size
        self._evict_past(max_bytes)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def hottest(self) -> list[int]:
        """Hashes, the most recently used first."""
        with self._lock:
            return list(reversed(self._sizes))

    def write(self, header: BlockHeader, payload, stamp_ns: int | None = None) -> bool:
        """Stores one block (`payload`: its KV bytes; `stamp_ns`: its recency, now when None). False when it cannot."""
        encoded = _encode(header)
        path = self.folder / file_name(header.block_hash)
        size = len(MAGIC) + _LEN_BYTES + len(encoded) + header.num_bytes
        if size > self.max_bytes:
            return False
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + len(encoded).to_bytes(_LEN_BYTES, "little") + encoded)
                f.write(payload)
            if stamp_ns is not None:
                os.utime(tmp, ns=(stamp_ns, stamp_ns))
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        with self._lock:
            self.num_bytes += size - self._sizes.pop(header.block_hash, 0)
            self._sizes[header.block_hash] = size
        self._evict_past(self.max_bytes)
        return True

    def touch(self, block_hash: int, stamp_ns: int | None = None) -> None:
        """Marks a stored block used now (or at `stamp_ns`)."""
        stamp_ns = time.time_ns() if stamp_ns is None else stamp_ns
        try:
            os.utime(self.folder / file_name(block_hash), ns=(stamp_ns, stamp_ns))
        except OSError:
            return
        with self._lock:
            if block_hash in self._sizes:
                self._sizes.move_to_end(block_hash)

    def read_header(self, block_hash: int) -> BlockHeader | None:
        """The header of a stored block (its KV unchecked), None when it is missing or damaged."""
        try:
            with open(self.folder / file_name(block_hash), "rb") as f:
                head = f.read(4096)
                length = _header_length(head)
                if length is None:
                    return self._drop(block_hash)
                start = len(MAGIC) + _LEN_BYTES
                if start + length > len(head):
                    head += f.read(start + length - len(head))
            header = _decode_header(head[start : start + length])
        except (OSError, msgspec.DecodeError):
            return self._drop(block_hash)
        return header if header.block_hash == block_hash else self._drop(block_hash)

    def read(self, block_hash: int) -> tuple[BlockHeader, bytes] | None:
        """(header, KV bytes) of a stored block, checked whole; None (and the file gone) when it fails a check."""
        try:
            data = (self.folder / file_name(block_hash)).read_bytes()
            length = _header_length(data)
            if length is None:
                return self._drop(block_hash)
            start = len(MAGIC) + _LEN_BYTES
            header = _decode_header(data[start : start + length])
        except (OSError, msgspec.DecodeError):
            return self._drop(block_hash)
        payload = data[start + length :]
        if (header.block_hash != block_hash or len(payload) != header.num_bytes
                or zlib.crc32(payload) != header.crc32):
            return self._drop(block_hash)
        return header, payload

    def _drop(self, block_hash: int) -> None:
        (self.folder / file_name(block_hash)).unlink(missing_ok=True)
        with self._lock:
            self.num_bytes -= self._sizes.pop(block_hash, 0)

    def _evict_past(self, max_bytes: int) -> None:
        while self.num_bytes > max_bytes:
            with self._lock:
                if not self._sizes:
                    return
                block_hash, size = self._sizes.popitem(last=False)
                self.num_bytes -= size
                self.num_evicted += 1
            (self.folder / file_name(block_hash)).unlink(missing_ok=True)


def _header_length(data: bytes) -> int | None:
    start = len(MAGIC) + _LEN_BYTES
    if len(data) < start or data[: len(MAGIC)] != MAGIC:
        return None
    return int.from_bytes(data[len(MAGIC) : start], "little")


def _signed(value: int) -> int:
    """A file name's 64-bit hash back to Python's signed hash value."""
    return value - (1 << 64) if value >= 1 << 63 else value
