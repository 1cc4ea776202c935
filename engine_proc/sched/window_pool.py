"""The KV blocks of a model's sliding-window layers, when it also has global ones (Gemma 2 and 3,
GPT-OSS): a pool and a block table per request of their own, so that a sliding layer holds at most
its window while the global layers keep every block (vLLM's hybrid KV-cache manager does the same).

A request's `window_block_ids` runs parallel to its `block_ids` (entry i holds positions
[i * block_size, (i + 1) * block_size)), with the null block in place of every block that fell out
of the window. The pool is sized never to run out (`window_pool_size`), so the scheduler counts the
global blocks only.

Prefix caching: a full block of computed tokens is indexed by the serial of the global prefix
cache's entry for the same block (serials name one exact prefix and are never reused, so a hit needs
no hash of its own). A hit on n global blocks is served only as far as the window's blocks before its
end are cached too (`usable_hits`): the first token computed after a hit attends to them.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from rill.engine_proc.sched.request import EngineRequest

NULL_BLOCK_ID = 0  # the padding block, never handed out (block_manager.py)


def window_pool_size(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                     num_global_blocks: int) -> int:
    """Blocks (the null block included) that the window pool needs so that it never runs out.

    After a step a request holds the blocks from the one of position num_computed - window + 1 on;
    the next step adds its new tokens' blocks: at most ceil((window - 1) / block_size) + 2 blocks
    plus its new tokens' share, and the new tokens of one step are at most max_num_batched_tokens.
    Never more than the global pool: a request's window blocks are a subset of its positions, and
    shared ones are shared in both pools alike.
    """
    per_seq = -(-(window - 1) // block_size) + 3
    bound = max_num_seqs * per_seq + -(-max_num_batched_tokens // block_size) + 1
    return min(bound, num_global_blocks)


def window_pool_of(runner, num_blocks: int) -> WindowPool | None:
    """The window pool for a runner whose model has sliding and global layers (its `layer_window`),
    beside a global pool of `num_blocks`; None for any other."""
    if runner.layer_window is None:
        return None
    cache = runner.kv_cache
    return WindowPool(min(cache.num_window_blocks, num_blocks), cache.block_size, runner.layer_window[0])


class WindowPool:
    """Hands out the sliding layers' blocks, releases those out of the window, keeps full ones findable."""

    def __init__(self, num_blocks: int, block_size: int, window: int) -> None:
        assert num_blocks >= 2 and window >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window = window
        self.ref_counts = [0] * num_blocks
        self.ref_counts[NULL_BLOCK_ID] = 1
        self._free = list(range(num_blocks - 1, NULL_BLOCK_ID, -1))  # a stack, ascending ids first
        self._by_serial: dict[int, int] = {}  # the global entry's serial -> the window block
        self._serial_of: dict[int, int] = {}  # the reverse, for the cached blocks
        self._free_lru: OrderedDict[int, None] = OrderedDict()  # cached blocks nobody holds, oldest first
        self._registered: dict[str, int] = {}  # req_id -> blocks of its table looked at for the index

    # ---- figures --------------------------------------------------------------------------

    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._free_lru)

    def num_total_blocks(self) -> int:
        return self.num_blocks - 1

    def first_needed(self, num_computed: int) -> int:
        """The first block a query at position num_computed or later can read."""
        return max(0, num_computed - self.window + 1) // self.block_size

    # ---- a request's table ------------------------------------------------------------------

    def allocate(self, req: EngineRequest, num_tokens: int) -> None:
        """Extends req.window_block_ids to cover positions [0, num_tokens): null blocks before the
        window of its first new token, new ones after."""
        table = req.window_block_ids
        num_needed = -(-num_tokens // self.block_size)
        if num_needed <= len(table):
            return
        first = self.first_needed(req.num_computed_tokens)
        new = [NULL_BLOCK_ID] * max(0, min(first, num_needed) - len(table))
        for _ in range(num_needed - len(table) - len(new)):
            new.append(self._take())
        req.window_block_ids = table + new  # a new list: a step in flight may read the old one

    def _take(self) -> int:
        if self._free:
            block_id = self._free.pop()
        else:
            assert self._free_lru, "the window pool ran out: window_pool_size() is wrong"
            block_id, _ = self._free_lru.popitem(last=False)
            self._forget(block_id)
        self.ref_counts[block_id] = 1
        return block_id

    def release_out_of_window(self, req: EngineRequest) -> None:
        """After a step: the blocks no later query of req can reach go back (cached ones stay findable)."""
        num_gone = min(self.first_needed(req.num_computed_tokens), len(req.window_block_ids))
        table = req.window_block_ids
        if num_gone == 0 or table[num_gone - 1] == NULL_BLOCK_ID:
            return
        for i in range(num_gone - 1, -1, -1):
            if table[i] == NULL_BLOCK_ID:
                break
            self._release(table[i])
        req.window_block_ids = [NULL_BLOCK_ID] * num_gone + table[num_gone:]

    def free(self, req: EngineRequest) -> None:
        self._registered.pop(req.req_id, None)
        for block_id in reversed(req.window_block_ids):
            if block_id != NULL_BLOCK_ID:
                self._release(block_id)
        req.window_block_ids = []

    def held_blocks(self, req: EngineRequest) -> int:
        return sum(1 for block_id in req.window_block_ids if block_id != NULL_BLOCK_ID)

    def _release(self, block_id: int) -> None:
        count = self.ref_counts[block_id] - 1
        assert count >= 0, f"window block {block_id} freed more often than held"
        self.ref_counts[block_id] = count
        if count == 0:
            if block_id in self._serial_of:
                self._free_lru[block_id] = None
            else:
                self._free.append(block_id)

    # ---- prefix caching ------------------------------------------------------------------------

    def register(self, req: EngineRequest, serial_at: Callable[[int], int | None]) -> None:
        """Indexes req's window blocks that are full of computed tokens, each under serial_at(i), the
        serial of the global cache's entry for its block i (None: that one is not cached, nor is this)."""
        table = req.window_block_ids
        start = self._registered.get(req.req_id, 0)
        end = min(req.num_computed_tokens // self.block_size, len(table))
        for i in range(start, end):
            block_id = table[i]
            if block_id == NULL_BLOCK_ID or block_id in self._serial_of:
                continue
            serial = serial_at(i)
            if serial is None or serial in self._by_serial:  # not cached, or computed twice: ours stays private
                continue
            self._by_serial[serial] = block_id
            self._serial_of[block_id] = serial
        self._registered[req.req_id] = max(start, end)

    def usable_hits(self, serials: list[int]) -> int:
        """How many of the global hits (their serials, in order) a request can start after: the most n
        whose window blocks before position n * block_size are all cached here."""
        for n in range(len(serials), 0, -1):
            first = self.first_needed(n * self.block_size)
            if all(serial in self._by_serial for serial in serials[first:n]):
                return n
        return 0

    def share(self, req: EngineRequest, serials: list[int]) -> None:
        """The window blocks of a hit on len(serials) global blocks (usable_hits() said so) become req's."""
        assert not req.window_block_ids, "a shared prefix comes first"
        first = self.first_needed(len(serials) * self.block_size)
        table = [NULL_BLOCK_ID] * first
        for serial in serials[first:]:
            block_id = self._by_serial[serial]
            if self.ref_counts[block_id] == 0:
                del self._free_lru[block_id]
            self.ref_counts[block_id] += 1
            table.append(block_id)
        req.window_block_ids = table
        self._registered[req.req_id] = len(table)

    def _forget(self, block_id: int) -> None:
        serial = self._serial_of.pop(block_id, None)
        if serial is not None:
            del self._by_serial[serial]
