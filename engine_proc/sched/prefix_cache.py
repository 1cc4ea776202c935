"""Automatic prefix caching: full KV blocks found again by a chained hash of their token ids."""
from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import NamedTuple

from rill.engine_proc.sched.chain_roots import ROOT_HASH, ROOT_SERIAL, ChainRoots, RootKey
from rill.engine_proc.sched.request import EngineRequest

__all__ = ["ROOT_HASH", "ROOT_SERIAL", "CachedBlock", "PrefixCache"]


class _Entry:
    """What the cache knows about one block: its key, its content, and which entry precedes it."""

    __slots__ = ("block_hash", "token_ids", "serial", "parent_serial", "parent_hash", "depth", "root_key")

    def __init__(self, block_hash: int, token_ids: tuple[int, ...], serial: int, parent_serial: int,
                 parent_hash: int = ROOT_HASH, depth: int = 0, root_key: RootKey = ("", 0, b"")) -> None:
        self.block_hash = block_hash
        self.token_ids = token_ids
        self.serial = serial  # never reused, unlike block ids: names this exact prefix
        self.parent_serial = parent_serial
        # What the disk tier (engine_proc/kv_disk/) writes beside the block's KV to find it again after a restart
        self.parent_hash = parent_hash  # the root's hash for a first block
        self.depth = depth  # the block's index in its prompt
        self.root_key = root_key  # (adapter name, its load id, cache salt) of the root the chain starts from


class CachedBlock(NamedTuple):
    """A cached block as the disk tier spills and reloads it (engine_proc/kv_disk/)."""

    block_hash: int
    parent_hash: int  # the root's hash for a first block (depth 0)
    depth: int
    token_ids: tuple[int, ...]
    root_key: RootKey


class _Chain:
    """How many of one request's leading blocks the cache knows, and the entry to go on from."""

    __slots__ = ("num_blocks", "last_hash", "last_serial")

    def __init__(self, num_blocks: int, last_hash: int, last_serial: int | None) -> None:
        self.num_blocks = num_blocks
        self.last_hash = last_hash
        self.last_serial = last_serial  # None: the chain broke, nothing further gets cached


class PrefixCache:
    """The hash index of full, computed blocks, and the LRU order of those that sit free.

    hash(block i) = hash_fn((hash(block i-1), token ids of block i)). The hash only finds a
    candidate; a hit is served only if the candidate's own token ids equal the request's AND
    its parent is the very entry matched one block earlier (by serial, never reused). By
    induction the whole prefix then matches, so a hash collision costs a miss, never wrong KV,
    whatever hash_fn is. That is why Python's built-in tuple hash is enough (and several times
    faster than hashlib's sha256, which vLLM offers because it trusts its hashes unverified):
    int hashes are not salted per process, and the index never leaves this one anyway.

    Pure bookkeeping: the block manager owns reference counts and the free stack, and tells
    this cache when a cached block is freed (`add_evictable`), shared again while free
    (`remove_evictable`), or needed for new tokens (`evict_oldest`).
    """

    def __init__(self, block_size: int, hash_fn: Callable[[Hashable], int] = hash, record_events: bool = False) -> None:
        self.block_size = block_size
        self._hash_fn = hash_fn
        self._block_id_by_hash: dict[int, int] = {}
        self._entries: dict[int, _Entry] = {}  # by block id
        self._live_serials: set[int] = set()  # of entries; roots' are the roots' own (ChainRoots.is_live)
        # One root per (adapter load, cache salt): weights loaded again under the same name never find blocks
        # computed with the old ones, and one tenant's salt never finds another's (docs/prefix-caching.md).
        self.roots = ChainRoots(hash_fn)
        # Free blocks that were cached when freed, least recently used first: O(1) to append,
        # to take out of the middle when a hit revives one, and to pop the oldest.
        self._free_lru: OrderedDict[int, None] = OrderedDict()
        self._chains: dict[str, _Chain] = {}  # by req_id, while the request holds blocks
        self._serials = itertools.count(ROOT_SERIAL + 1)
        self.num_registered = 0  # blocks register() has entered since start (the disk tier's idle spill watches it)
        # KV-cache events (--kv-events-endpoint, engine_proc/kv_events.py), when someone listens:
        # ("stored", hash, parent hash or None, token ids, adapter name or "", the adapter's load id or
        # 0) and ("removed", hash), in order.
        self.events: list[tuple] | None = [] if record_events else None
        # --kv-cache-disk (engine_proc/kv_disk/): (block id, CachedBlock) of each evicted block, taken before
        # the next model step overwrites it; set to a list by the disk tier.
        self.evicted: list[tuple[int, CachedBlock]] | None = None

    def take_events(self) -> list[tuple]:
        """The events since the last take (none unless built to `record_events`)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    # ---- figures --------------------------------------------------------------------------

    def num_evictable(self) -> int:
        return len(self._free_lru)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._entries

    def num_cached_blocks(self) -> int:
        return len(self._entries)

    def serial_of(self, block_id: int) -> int | None:
        """The serial naming the exact prefix a cached block ends (None: not cached)."""
        entry = self._entries.get(block_id)
        return None if entry is None else entry.serial

    # ---- lookup -----------------------------------------------------------------------------

    def find(self, req: EngineRequest, max_num_blocks: int) -> list[int]:
        """Ids of the cached blocks holding req's longest prefix of full blocks (at most max_num_blocks)."""
        block_size = self.block_size
        hits: list[int] = []
        root = self.roots.find(req)
        if root is None:  # nothing is cached under its adapter load and salt
            return hits
        parent_hash, parent_serial = root
        for i in range(max_num_blocks):
            token_ids = tuple(req.token_ids(i * block_size, (i + 1) * block_size))
            block_hash = self._hash_fn((parent_hash, token_ids))
            block_id = self._block_id_by_hash.get(block_hash)
            if block_id is None:
                break
            entry = self._entries[block_id]
            if entry.parent_serial != parent_serial or entry.token_ids != token_ids:
                break  # a hash collision: another prefix's block
            hits.append(block_id)
            parent_hash, parent_serial = block_hash, entry.serial
        return hits

    # ---- one request's chain --------------------------------------------------------------------

    def start_chain(self, req: EngineRequest) -> None:
        """Goes on from req's shared leading blocks (req.block_ids, just shared from the cache)."""
        assert req.req_id not in self._chains, "start_chain() twice without end_chain()"
        if not req.block_ids:
            return
        last = self._entries.get(req.block_ids[-1])
        if last is None:  # shared by hand, not found here: nothing to chain new blocks to
            self._chains[req.req_id] = _Chain(len(req.block_ids), ROOT_HASH, None)
        else:
            self._chains[req.req_id] = _Chain(len(req.block_ids), last.block_hash, last.serial)

    def end_chain(self, req: EngineRequest) -> None:
        self._chains.pop(req.req_id, None)

    def register(self, req: EngineRequest, num_full_blocks: int) -> None:
        """Enters req's blocks [.., num_full_blocks), now full of computed KV, into the index.

        Only full blocks whose every token is computed: nobody writes into them again (their
        owner writes at positions past them), which is what makes sharing them safe.
        """
        chain = self._chains.get(req.req_id)
        if chain is None:
            if num_full_blocks == 0:
                return
            chain = self._chains[req.req_id] = _Chain(0, *self.roots.root(req))
        if chain.num_blocks >= num_full_blocks:
            return
        if chain.last_serial not in self._live_serials and not self.roots.is_live(chain.last_serial):
            # Broken, or its last entry was evicted since: new entries under it could never
            # be found, and would only push out live ones.
            chain.num_blocks, chain.last_serial = num_full_blocks, None
            return
        block_size = self.block_size
        root_key = self.roots.key_of(req)
        for i in range(chain.num_blocks, num_full_blocks):
            token_ids = tuple(req.token_ids(i * block_size, (i + 1) * block_size))
            block_hash = self._hash_fn((chain.last_hash, token_ids))
            known_id = self._block_id_by_hash.get(block_hash)
            if known_id is not None:
                known = self._entries[known_id]
                if known.parent_serial == chain.last_serial and known.token_ids == token_ids:
                    # The same prefix computed twice (both requests admitted before either
                    # was cached): keep the first copy; ours stays private and is freed plainly.
                    chain.last_hash, chain.last_serial = block_hash, known.serial
                    continue
                # A collision, or an entry whose parent was evicted (unreachable now): the
                # newest wins, so that a live prefix is not locked out by a stale one.
                self._forget(known_id)
            block_id = req.block_ids[i]
            assert block_id not in self._entries, "a request's own new block is already cached"
            entry = _Entry(block_hash, token_ids, next(self._serials), chain.last_serial, chain.last_hash, i,
                           root_key)
            self.num_registered += 1
            if self.events is not None:
                self.events.append(("stored", block_hash, chain.last_hash if i else None, token_ids, req.lora,
                                    req.lora_load_id))
            self._entries[block_id] = entry
            self._live_serials.add(entry.serial)
            self.roots.add_child(entry.parent_serial)
            self._block_id_by_hash[block_hash] = block_id
            chain.last_hash, chain.last_serial = block_hash, entry.serial
        chain.num_blocks = num_full_blocks

    # ---- free cached blocks ----------------------------------------------------------------------

    def add_evictable(self, block_id: int) -> None:
        """A cached block nobody holds any more: findable until evict_oldest() takes it."""
        self._free_lru[block_id] = None

    def remove_evictable(self, block_id: int) -> None:
        """A free cached block shared again (a hit): off the LRU, keeps its entry."""
        del self._free_lru[block_id]

    def evict_oldest(self) -> int:
        """The least recently freed evictable block, its entry forgotten, for new tokens."""
        block_id, _ = self._free_lru.popitem(last=False)
        if self.evicted is not None and (entry := self._entries.get(block_id)) is not None:
            self.evicted.append((block_id, _cached_block(entry)))
        self._forget(block_id)
        return block_id

    def clear(self) -> list[int]:
        """Forgets every entry (vLLM's reset_prefix_cache, SGLang's flush_cache): held blocks stay their holders'
        but are found no more, and their chains end. The free cached blocks, taken off the LRU: the caller frees them."""
        for block_id in list(self._entries):
            self._forget(block_id)
        for chain in self._chains.values():
            chain.last_serial = None
        free_ids = list(self._free_lru)
        self._free_lru.clear()
        return free_ids

    # ---- the disk tier's view (engine_proc/kv_disk/) ----------------------------------------------

    def take_evicted(self) -> list[tuple[int, CachedBlock]]:
        """(block id, block) evicted since the last take: their KV is intact until the next model step."""
        evicted = self.evicted
        if not evicted:
            return []
        self.evicted = []
        return evicted

    def hottest(self, ref_counts: list[int]) -> Iterator[tuple[int, CachedBlock]]:
        """Every cached block, held ones first, then the free ones most recently used first."""
        for block_id, entry in self._entries.items():
            if ref_counts[block_id]:
                yield block_id, _cached_block(entry)
        for block_id in reversed(self._free_lru):
            if (entry := self._entries.get(block_id)) is not None:
                yield block_id, _cached_block(entry)

    def adopt(self, block_id: int, block: CachedBlock) -> bool:
        """Indexes a free block whose KV was read back from disk, as register() would have, evictable (the caller puts
        it on the LRU). False, and nothing changed, when it is known already, its parent is not cached, or its
        hash is not what this process computes for its parent and tokens (another hash function, a damaged file)."""
        if block.block_hash in self._block_id_by_hash or len(block.token_ids) != self.block_size:
            return False
        if block.depth == 0:
            if block.parent_hash != self.roots.hash_of_key(block.root_key):
                return False
            parent_serial = None
        else:
            parent_id = self._block_id_by_hash.get(block.parent_hash)
            if parent_id is None:
                return False
            parent_serial = self._entries[parent_id].serial
        if self._hash_fn((block.parent_hash, block.token_ids)) != block.block_hash:
            return False
        if parent_serial is None:
            parent_serial = self.roots.root_of_key(block.root_key)[1]
        entry = _Entry(block.block_hash, block.token_ids, next(self._serials), parent_serial, block.parent_hash,
                       block.depth, block.root_key)
        if self.events is not None:
            lora, load_id, _ = block.root_key
            self.events.append(("stored", block.block_hash, block.parent_hash if block.depth else None,
                                block.token_ids, lora, load_id))
        self._entries[block_id] = entry
        self._live_serials.add(entry.serial)
        self.roots.add_child(parent_serial)
        self._block_id_by_hash[block.block_hash] = block_id
        return True

    def _forget(self, block_id: int) -> None:
        # A block forgotten while free stays on the LRU: still reusable, just not findable.
        entry = self._entries.pop(block_id, None)
        if entry is None:
            return
        self._live_serials.discard(entry.serial)
        self.roots.remove_child(entry.parent_serial)
        del self._block_id_by_hash[entry.block_hash]
        if self.events is not None:
            self.events.append(("removed", entry.block_hash))  # every entry is indexed: see register()


def _cached_block(entry: _Entry) -> CachedBlock:
    return CachedBlock(entry.block_hash, entry.parent_hash, entry.depth, entry.token_ids, entry.root_key)
