"""The KV blocks of a model's sliding-window layers, when it also has global ones (Gemma 2 and 3,
GPT-OSS): block tables of their own, so that a sliding layer holds at most its window while the global
layers keep every block, all drawn from the one pool of blocks (vLLM's hybrid KV-cache manager).

The KV memory is `group_size` (the number of global layers) block tensors. The global layers are one
group of that size, with the request's `block_ids`; the sliding layers are cut into `num_groups`
groups of at most that size, each with a table of its own in `req.window_block_ids` (one list per
group), whose block ids address the same tensors: a block id belongs to one group's table at a time.
So a block costs the same memory in every group, and the pool goes to the global layers and the
windows as the requests need them.

A window table runs parallel to `block_ids` (entry i holds positions [i * block_size, (i + 1) *
block_size)), with the null block in place of every block that fell out of the window.

Prefix caching: a full block of computed tokens is indexed by (the serial of the global prefix
cache's entry for the same block, the group): serials name one exact prefix and are never reused, so
a hit needs no hash of its own. A hit on n global blocks is served only as far as every group's
window blocks before its end are cached too (`usable_hits`): the first token computed after it
attends to them. A cached window block that nobody holds waits on the prefix cache's LRU with the
global ones, and is evicted in the same order.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rill.engine_proc.sched.request import EngineRequest

NULL_BLOCK_ID = 0  # the padding block, never handed out (block_manager.py)


def layer_groups(window_layers: tuple[int, ...], num_layers: int) -> tuple[int, list[tuple[int, int]]]:
    """(number of sliding groups, each layer's (group, slot)): group 0 holds the global layers, in
    order, a slot each; the sliding layers fill groups 1, 2, ... as many at a time as there are
    global layers. A layer's K/V lives in block tensor `slot`, addressed by its group's table."""
    sliding = set(window_layers)
    globals_ = [i for i in range(num_layers) if i not in sliding]
    size = len(globals_)
    place = [(0, 0)] * num_layers
    for slot, layer in enumerate(globals_):
        place[layer] = (0, slot)
    for m, layer in enumerate(sorted(sliding)):
        place[layer] = (1 + m // size, m % size)
    return -(-len(sliding) // size), place


def window_tables_of(runner) -> tuple[int, int] | None:
    """(window, number of sliding groups) for the block manager of a runner whose model has sliding
    and global layers (its `layer_window`: the window and the sliding layers); None for any other."""
    if runner.layer_window is None:
        return None
    return runner.layer_window[0], runner.kv_cache.num_window_groups


class BlockPool(Protocol):
    """What the window tables draw on: the block manager's free blocks and reference counts."""

    ref_counts: list[int]

    def take(self, num_blocks: int) -> list[int]: ...

    def release(self, block_id: int) -> None: ...

    def revive(self, block_id: int) -> None: ...


class WindowTables:
    """The sliding layers' block tables: blocks out of the window released, full ones kept findable."""

    def __init__(self, pool: BlockPool, block_size: int, window: int, num_groups: int) -> None:
        assert window >= 1 and num_groups >= 1
        self.pool = pool
        self.block_size = block_size
        self.window = window
        self.num_groups = num_groups
        self._by_key: dict[tuple[int, int], int] = {}  # (global entry's serial, group) -> block
        self._key_of: dict[int, tuple[int, int]] = {}  # the reverse, for the cached blocks
        self._registered: dict[str, int] = {}  # req_id -> entries of its tables looked at for the index

    def first_needed(self, num_computed: int) -> int:
        """The first block a query at position num_computed or later can read."""
        return max(0, num_computed - self.window + 1) // self.block_size

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._key_of

    def forget(self, block_id: int) -> None:
        """A cached window block evicted for new tokens."""
        key = self._key_of.pop(block_id, None)
        if key is not None:
            del self._by_key[key]

    def clear(self) -> None:
        """Forgets every cached window block (the global cache was cleared)."""
        self._by_key.clear()
        self._key_of.clear()

    # ---- a request's tables -----------------------------------------------------------------

    def num_needed(self, req: EngineRequest, num_tokens: int) -> int:
        """Blocks allocate(req, num_tokens) takes from the pool (every group's)."""
        tables = req.window_block_ids
        num_entries = -(-num_tokens // self.block_size)
        have = len(tables[0]) if tables else 0
        if num_entries <= have:
            return 0
        first = max(have, min(self.first_needed(req.num_computed_tokens), num_entries))
        return (num_entries - first) * self.num_groups

    def allocate(self, req: EngineRequest, num_tokens: int) -> None:
        """Extends every group's table to cover positions [0, num_tokens): null blocks before the
        window of the first new token, new ones after."""
        num_entries = -(-num_tokens // self.block_size)
        tables = req.window_block_ids or [[] for _ in range(self.num_groups)]
        have = len(tables[0])
        if num_entries <= have:
            return
        first = max(have, min(self.first_needed(req.num_computed_tokens), num_entries))
        new = self.pool.take((num_entries - first) * self.num_groups)
        per_group = num_entries - first
        # New lists: a step in flight may still read the old tables.
        req.window_block_ids = [table + [NULL_BLOCK_ID] * (first - have) + new[j * per_group:(j + 1) * per_group]
                                for j, table in enumerate(tables)]

    def release_out_of_window(self, req: EngineRequest) -> None:
        """After a step: the blocks no later query of req can reach go back (cached ones stay findable)."""
        tables = req.window_block_ids
        if not tables:
            return
        num_gone = min(self.first_needed(req.num_computed_tokens), len(tables[0]))
        if num_gone == 0 or tables[0][num_gone - 1] == NULL_BLOCK_ID:
            return
        for table in tables:
            for i in range(num_gone - 1, -1, -1):
                if table[i] == NULL_BLOCK_ID:
                    break
                self.pool.release(table[i])
        req.window_block_ids = [[NULL_BLOCK_ID] * num_gone + table[num_gone:] for table in tables]

    def free(self, req: EngineRequest) -> None:
        self._registered.pop(req.req_id, None)
        for table in req.window_block_ids:
            for block_id in reversed(table):
                if block_id != NULL_BLOCK_ID:
                    self.pool.release(block_id)
        req.window_block_ids = []

    def held_blocks(self, req: EngineRequest) -> int:
        """Blocks req's window tables hold, every group's."""
        return sum(1 for table in req.window_block_ids for block_id in table if block_id != NULL_BLOCK_ID)

    @staticmethod
    def num_held(reqs) -> int:
        """Distinct blocks the window tables of `reqs` hold (for /stats)."""
        return len({b for req in reqs for table in req.window_block_ids for b in table} - {NULL_BLOCK_ID})

    # ---- prefix caching ------------------------------------------------------------------------

    def register(self, req: EngineRequest, serial_at: Callable[[int], int | None]) -> None:
        """Indexes req's window blocks that are full of computed tokens, under serial_at(i), the serial
        of the global cache's entry for its block i (None: that one is not cached, nor are these)."""
        tables = req.window_block_ids
        if not tables:
            return
        start = self._registered.get(req.req_id, 0)
        end = min(req.num_computed_tokens // self.block_size, len(tables[0]))
        for i in range(start, end):
            if tables[0][i] == NULL_BLOCK_ID:
                continue
            serial = serial_at(i)
            if serial is None:
                continue
            for group, table in enumerate(tables):
                key, block_id = (serial, group), table[i]
                if key not in self._by_key and block_id not in self._key_of:  # else computed twice: ours stays private
                    self._by_key[key] = block_id
                    self._key_of[block_id] = key
        self._registered[req.req_id] = max(start, end)

    def usable_hits(self, serials: list[int]) -> int:
        """How many of the global hits (their serials, in order) a request can start after: the most n
        whose window blocks before position n * block_size are all cached, in every group."""
        by_key, groups = self._by_key, range(self.num_groups)
        best, last_missing = 0, -1  # the last entry below n some group lacks
        for n, serial in enumerate(serials, 1):
            if not all((serial, group) in by_key for group in groups):
                last_missing = n - 1
            if last_missing < self.first_needed(n * self.block_size):
                best = n
        return best

    def hit_blocks(self, serials: list[int]) -> list[int]:
        """The window blocks a hit on len(serials) global blocks shares (usable_hits() said it can)."""
        first = self.first_needed(len(serials) * self.block_size)
        return [self._by_key[(serial, group)] for group in range(self.num_groups) for serial in serials[first:]]

    def share(self, req: EngineRequest, serials: list[int]) -> None:
        """The window blocks of a hit on len(serials) global blocks become req's."""
        assert not req.window_block_ids, "a shared prefix comes first"
        first = self.first_needed(len(serials) * self.block_size)
        tables = []
        for group in range(self.num_groups):
            table = [NULL_BLOCK_ID] * first
            for serial in serials[first:]:
                block_id = self._by_key[(serial, group)]
                self.pool.revive(block_id)
                table.append(block_id)
            tables.append(table)
        req.window_block_ids = tables
        self._registered[req.req_id] = len(serials)
