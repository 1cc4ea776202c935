"""Paged KV-cache bookkeeping: fixed-size blocks, a free stack, and a reference count per block."""
from __future__ import annotations

from collections.abc import Callable, Hashable

from rill.engine_proc.sched.prefix_cache import CachedBlock, PrefixCache
from rill.engine_proc.sched.request import EngineRequest

# Block 0 (NULL_BLOCK_ID) is never handed to a request: the model runner can pad block tables and
# point the slots of padding tokens at it, so padded writes land somewhere harmless. The KV tensor
# therefore has `num_blocks` blocks, of which `num_blocks - 1` hold requests' tokens.
from rill.engine_proc.sched.window_tables import NULL_BLOCK_ID, WindowTables


class BlockManager:
    """Hands out KV blocks to requests; a block is free again when its reference count hits 0.

    With prefix caching on, full blocks of computed tokens are entered into a `PrefixCache`
    (`after_step`), found again by content (`find_cached_blocks`) and shared between
    requests (`share`). A freed cached block stays findable until its slot is needed: a block
    is free either on the plain stack (never cached) or on the cache's LRU (evictable), and
    `allocate` takes from the stack first, so cached content is given up only under pressure.
    Both count as free, so admission control reads `num_free_blocks` as before.

    A model with sliding and global layers (`window`: its window and number of sliding-layer
    groups): `req.block_ids` are then the global layers' blocks, and `self.window`
    (window_tables.py) keeps the sliding layers' tables, drawn from the same free blocks.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        hash_fn: Callable[[Hashable], int] = hash,
        record_events: bool = False,
        sliding_window: int | None = None,
        window: tuple[int, int] | None = None,
    ) -> None:
        assert num_blocks >= 2, "block 0 is the null block: at least one more is needed"
        assert block_size >= 1
        self.num_blocks = num_blocks  # size of the KV tensor, null block included
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.ref_counts[NULL_BLOCK_ID] = 1  # pinned: never on the free stack
        # A stack (pop from the end): O(1) both ways, and a just-freed block, likely still
        # warm in the GPU's L2, is the next one reused. Filled in reverse so that ids come
        # out ascending on a fresh cache, which keeps block tables readable in tests.
        self._free_block_ids = list(range(num_blocks - 1, NULL_BLOCK_ID, -1))
        # `record_events`: the prefix cache keeps its KV-cache events for --kv-events-endpoint.
        self.prefix_cache = PrefixCache(block_size, hash_fn, record_events) if enable_prefix_caching else None
        # A model whose every layer attends within this many tokens: a block whose tokens all lie
        # before every later query's window is released as the request moves on (after_step).
        self.sliding_window = sliding_window
        self.window = WindowTables(self, block_size, *window) if window is not None else None

    @property
    def enable_prefix_caching(self) -> bool:
        return self.prefix_cache is not None

    def num_free_blocks(self) -> int:
        """Blocks allocate() can hand out: never-cached ones and evictable cached ones."""
        cache = self.prefix_cache
        return len(self._free_block_ids) + (cache.num_evictable() if cache is not None else 0)

    def num_total_blocks(self) -> int:
        """Blocks that can hold tokens (the null block excluded)."""
        return self.num_blocks - 1

    def num_tokens_alone(self, max_chunk: int) -> int:
        """The longest request the cache holds on its own, scheduled in chunks of at most max_chunk
        tokens. With window tables, each group's holds at most the window and a chunk, and never more
        than the request's own length."""
        num_blocks = self.num_total_blocks()
        if self.window is not None:
            groups = self.window.num_groups
            per_group = -(-(self.window.window - 1 + max_chunk) // self.block_size) + 2
            num_blocks = max(num_blocks // (1 + groups), num_blocks - groups * per_group)
        return max(0, num_blocks) * self.block_size

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that positions [0, num_tokens) span."""
        return -(-num_tokens // self.block_size)

    def num_blocks_needed(self, req: EngineRequest, num_tokens: int) -> int:
        """Extra blocks `req` needs so that its tables cover positions [0, num_tokens)."""
        num_needed = self._num_global_needed(req, num_tokens)
        return num_needed + (self.window.num_needed(req, num_tokens) if self.window is not None else 0)

    def _num_global_needed(self, req: EngineRequest, num_tokens: int) -> int:
        return max(0, self.num_blocks_for(num_tokens) - len(req.block_ids))

    def num_blocks_to_admit(self, req: EngineRequest, cached_ids: list[int], num_tokens: int) -> int:
        """Free blocks admitting `req` takes: its tables to cover [0, num_tokens) after a hit on
        `cached_ids` (find_cached_blocks'), of which those that sit free count like new ones."""
        num_new = self.num_blocks_for(num_tokens) - len(cached_ids)
        num_taken = num_new + self.num_free_among(cached_ids)
        if self.window is not None:
            hit_blocks = self.window.hit_blocks(self._serials(cached_ids)) if cached_ids else []
            num_taken += num_new * self.window.num_groups + self.num_free_among(hit_blocks)
        return num_taken

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks()

    def allocate(self, req: EngineRequest, num_tokens: int) -> None:
        """Appends blocks to `req.block_ids` (and its window tables) to cover positions [0, num_tokens)."""
        if self.window is not None:
            self.window.allocate(req, num_tokens)
        num_new_blocks = self._num_global_needed(req, num_tokens)
        if num_new_blocks:
            req.block_ids.extend(self.take(num_new_blocks))

    def take(self, num_blocks: int) -> list[int]:
        """`num_blocks` free blocks, each held once: never-cached ones first, then the oldest cached."""
        assert num_blocks <= self.num_free_blocks(), "allocate() without can_allocate()"
        free_ids = self._free_block_ids
        num_from_stack = min(num_blocks, len(free_ids))
        new_ids = free_ids[len(free_ids) - num_from_stack :]
        del free_ids[len(free_ids) - num_from_stack :]
        new_ids.reverse()  # the order pop() would give: the top of the stack first
        for _ in range(num_blocks - num_from_stack):
            block_id = self.prefix_cache.evict_oldest()
            if self.window is not None:
                self.window.forget(block_id)
            new_ids.append(block_id)
        ref_counts = self.ref_counts
        for block_id in new_ids:
            ref_counts[block_id] = 1
        return new_ids

    def revive(self, block_id: int) -> None:
        """One more holder of a block that is held, or cached and free (then off the LRU)."""
        count = self.ref_counts[block_id]
        if count == 0:
            self.prefix_cache.remove_evictable(block_id)
        self.ref_counts[block_id] = count + 1

    # ---- prefix caching (no-ops when it is off) ---------------------------------------------

    def find_cached_blocks(self, req: EngineRequest, max_num_blocks: int) -> list[int]:
        """Cached blocks holding req's leading full blocks, at most max_num_blocks; [] when off."""
        if self.prefix_cache is None or max_num_blocks <= 0:
            return []
        hits = self.prefix_cache.find(req, max_num_blocks)
        if self.window is not None and hits:  # as far as the sliding layers' blocks are cached too
            hits = hits[: self.window.usable_hits(self._serials(hits))]
        return hits

    def adopt_cached(self, blocks: list[CachedBlock]) -> list[int | None]:
        """Blocks read back from disk (engine_proc/kv_disk/), parents before children, made cached and free, each
        in a never-cached free block: their ids, None for one not adopted (PrefixCache.adopt says when). The
        deepest go on the LRU first, so a prompt's head outlives its tail, as free() orders them."""
        cache, free_ids = self.prefix_cache, self._free_block_ids
        block_ids: list[int | None] = []
        for block in blocks:
            adopted = bool(free_ids) and cache.adopt(free_ids[-1], block)
            block_ids.append(free_ids.pop() if adopted else None)
        for block_id in reversed(block_ids):
            if block_id is not None:
                cache.add_evictable(block_id)
        return block_ids

    def reset_prefix_cache(self) -> int:
        """Empties the prefix cache between two steps: every free cached block is a plain free block again, and
        held ones are no longer found (their holders keep them). The number of blocks it indexed; 0 when off."""
        cache = self.prefix_cache
        if cache is None:
            return 0
        num_cached = cache.num_cached_blocks()
        if self.window is not None:
            self.window.clear()
        self._free_block_ids.extend(cache.clear())
        return num_cached

    def _serials(self, block_ids: list[int]) -> list[int]:
        return [self.prefix_cache.serial_of(block_id) for block_id in block_ids]

    def num_free_among(self, block_ids: list[int]) -> int:
        """How many of these (cached) blocks sit free: sharing them takes them off the free count."""
        ref_counts = self.ref_counts
        return sum(1 for block_id in block_ids if ref_counts[block_id] == 0)

    def share(self, req: EngineRequest, block_ids: list[int]) -> None:
        """Makes `block_ids` (held by others, or cached and free) the first blocks of `req`."""
        assert not req.block_ids, "a shared prefix comes first"
        cache = self.prefix_cache
        for block_id in block_ids:
            assert block_id != NULL_BLOCK_ID
            assert self.ref_counts[block_id] or cache.is_cached(block_id), "can share only held or cached blocks"
            self.revive(block_id)
        req.block_ids.extend(block_ids)
        if cache is not None:
            cache.start_chain(req)
        if self.window is not None:
            self.window.share(req, self._serials(block_ids))

    def after_step(self, req: EngineRequest) -> None:
        """After a step computed more of req: its blocks now full of computed tokens enter the prefix
        cache, then, under a sliding window, those no later query can reach are released."""
        if self.prefix_cache is not None:
            self.prefix_cache.register(req, req.num_computed_tokens // self.block_size)
        if self.window is not None:
            if self.prefix_cache is not None:
                serial_of, block_ids = self.prefix_cache.serial_of, req.block_ids
                self.window.register(req, lambda i: serial_of(block_ids[i]))
            self.window.release_out_of_window(req)
        if self.sliding_window is not None:
            self._release_out_of_window(req)

    def _release_out_of_window(self, req: EngineRequest) -> None:
        """The next query sits at position num_computed_tokens or later and sees keys after
        position num_computed_tokens - window: a block whose last position is at or before that is
        released, and the null block takes its place in req.block_ids (which keeps its length, so
        every position keeps its index). Cached ones stay findable, as a finished request's do."""
        num_gone = max(0, req.num_computed_tokens - self.sliding_window + 1) // self.block_size
        block_ids = req.block_ids
        if num_gone == 0 or block_ids[num_gone - 1] == NULL_BLOCK_ID:
            return
        for i in range(num_gone - 1, -1, -1):  # tail first, as free() does
            if block_ids[i] == NULL_BLOCK_ID:
                break
            self.release(block_ids[i])
        # A new list: a step in flight may still read the old block table.
        req.block_ids = [NULL_BLOCK_ID] * num_gone + block_ids[num_gone:]

    def held_blocks(self, req: EngineRequest) -> int:
        """Blocks req holds: its table less the null blocks of released ones."""
        return sum(1 for block_id in req.block_ids if block_id != NULL_BLOCK_ID)

    # ---- release ------------------------------------------------------------------------------

    def free(self, req: EngineRequest) -> None:
        """Releases all of `req`'s blocks (each is free again once nobody holds it)."""
        if self.prefix_cache is not None:
            self.prefix_cache.end_chain(req)
        if self.window is not None:
            self.window.free(req)
        # Tail first: cached blocks join the LRU in that order, so a request's tail is
        # evicted before its head; a tail block is unreachable without its head anyway, and
        # heads (system prompts) are what other requests share.
        for block_id in reversed(req.block_ids):
            if block_id != NULL_BLOCK_ID:  # a block a sliding window released already
                self.release(block_id)
        # A new list rather than clear(): a step in flight may still read the old block table.
        req.block_ids = []

    def release(self, block_id: int) -> None:
        """One holder fewer; with none left the block is free (findable still, if cached)."""
        count = self.ref_counts[block_id] - 1
        assert count >= 0, f"block {block_id} freed more often than held"
        self.ref_counts[block_id] = count
        if count == 0:
            cache = self.prefix_cache
            if cache is not None and (cache.is_cached(block_id) or (self.window and self.window.is_cached(block_id))):
                cache.add_evictable(block_id)
            else:
                self._free_block_ids.append(block_id)
