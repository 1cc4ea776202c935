"""The roots a prefix cache's chains start from: one per (LoRA adapter load, cache salt), kept while a block chains to it."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable

from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.cache_salt import salted_root

# The parent of a base-model, unsalted request's first block. Serials of real entries count from 1.
ROOT_HASH = 0
ROOT_SERIAL = 0

RootKey = tuple[str, int, bytes]  # (adapter name, its load id, cache salt)
_BASE_KEY: RootKey = ("", 0, b"")


class _Root:
    __slots__ = ("key", "block_hash", "serial", "num_children")

    def __init__(self, key: RootKey, block_hash: int, serial: int) -> None:
        self.key = key
        self.block_hash = block_hash
        self.serial = serial
        self.num_children = 0  # cached entries whose parent this root is (the first blocks of its chains)


class ChainRoots:
    """(hash, serial) each request's first block chains to. The base model's unsalted root is fixed; every
    other root (an adapter load's: the same tokens under other weights are other K/V; a salt's: another
    tenant's namespace) has a serial of its own, negative and never reused, so that no entry of one root
    can ever be taken for an entry of another, whatever their hashes.

    Bounded by the cache itself: a root lives while a cached entry chains to it and is dropped with its
    last child. Salts are many (one per API key and `cache_salt`), and a root nothing refers to is only a
    number; made again later, it gets a new serial, which orphans nothing because nothing is left under
    the old one. `root()` is called only to chain a first block at once, so there are never more roots
    than cached blocks.
    """

    def __init__(self, hash_fn: Callable[[Hashable], int] = hash) -> None:
        self._hash_fn = hash_fn
        self._by_key: dict[RootKey, _Root] = {}
        self._by_serial: dict[int, _Root] = {}
        self._serials = itertools.count(ROOT_SERIAL - 1, -1)

    def __len__(self) -> int:
        return len(self._by_key)

    @staticmethod
    def key_of(req: EngineRequest) -> RootKey:
        return req.lora, req.lora_load_id if req.lora else 0, req.params.cache_salt

    def find(self, req: EngineRequest) -> tuple[int, int] | None:
        """req's root if it exists (None: nothing is cached under it)."""
        key = self.key_of(req)
        if key == _BASE_KEY:
            return ROOT_HASH, ROOT_SERIAL
        root = self._by_key.get(key)
        return None if root is None else (root.block_hash, root.serial)

    def root(self, req: EngineRequest) -> tuple[int, int]:
        """req's root, made if it does not exist; the caller is about to chain a block to it."""
        return self.root_of_key(self.key_of(req))

    def root_of_key(self, key: RootKey) -> tuple[int, int]:
        """(hash, serial) of the root under `key`, made if it does not exist."""
        if key == _BASE_KEY:
            return ROOT_HASH, ROOT_SERIAL
        root = self._by_key.get(key)
        if root is None:
            root = _Root(key, self.hash_of_key(key), next(self._serials))
            self._by_key[key] = self._by_serial[root.serial] = root
        return root.block_hash, root.serial

    def hash_of_key(self, key: RootKey) -> int:
        """The root hash under `key`. An adapter's hashes a str, so it differs from process to process (the
        disk tier, engine_proc/kv_disk/, keeps none of an adapter's blocks); the base model's and a salt's are
        ints only, the same in every process."""
        lora, load_id, salt = key
        block_hash = self._hash_fn(("lora", lora, load_id)) if lora else ROOT_HASH
        return salted_root(block_hash, salt, self._hash_fn) if salt else block_hash

    def is_live(self, serial: int) -> bool:
        return serial == ROOT_SERIAL or serial in self._by_serial

    def add_child(self, serial: int) -> None:
        """A cached entry now chains to `serial` (a root's or not: others are ignored)."""
        root = self._by_serial.get(serial)
        if root is not None:
            root.num_children += 1

    def remove_child(self, serial: int) -> None:
        """A cached entry chaining to `serial` was forgotten: a root left with none is dropped."""
        root = self._by_serial.get(serial)
        if root is None:
            return
        root.num_children -= 1
        if root.num_children <= 0:
            del self._by_key[root.key], self._by_serial[serial]
