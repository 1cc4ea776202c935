"""Paged KV-cache bookkeeping: fixed-size blocks, a free stack, and a reference count per block."""
from __future__ import annotations

from engine_proc.request import EngineRequest

# Block 0 is never handed to a request: the model runner can pad block tables and point the
# slots of padding tokens at it, so padded writes land somewhere harmless. The KV tensor
# therefore has `num_blocks` blocks, of which `num_blocks - 1` hold requests' tokens.
NULL_BLOCK_ID = 0


class BlockManager:
    """Hands out KV blocks to requests; a block returns to the free stack when its count hits 0.

    Reference counts let a later prefix cache share one block between requests (`share`);
    today every allocated block has a count of 1.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
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

    def num_free_blocks(self) -> int:
        return len(self._free_block_ids)

    def num_total_blocks(self) -> int:
        """Blocks that can hold tokens (the null block excluded)."""
        return self.num_blocks - 1

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that positions [0, num_tokens) span."""
        return -(-num_tokens // self.block_size)

    def num_blocks_needed(self, req: EngineRequest, num_tokens: int) -> int:
        """Extra blocks `req` needs so that its block_ids cover positions [0, num_tokens)."""
        return max(0, -(-num_tokens // self.block_size) - len(req.block_ids))

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free_block_ids)

    def allocate(self, req: EngineRequest, num_tokens: int) -> None:
        """Appends blocks to `req.block_ids` so that they cover positions [0, num_tokens)."""
        num_new_blocks = self.num_blocks_needed(req, num_tokens)
        if num_new_blocks == 0:
            return
        free_ids = self._free_block_ids
        assert num_new_blocks <= len(free_ids), "allocate() without can_allocate()"
        new_ids = free_ids[-num_new_blocks:]
        del free_ids[-num_new_blocks:]
        new_ids.reverse()  # the order pop() would give: the top of the stack first
        ref_counts = self.ref_counts
        for block_id in new_ids:
            ref_counts[block_id] = 1
        req.block_ids.extend(new_ids)

    def share(self, req: EngineRequest, block_ids: list[int]) -> None:
        """Appends blocks another request already holds (a shared prefix) to `req.block_ids`."""
        ref_counts = self.ref_counts
        for block_id in block_ids:
            assert ref_counts[block_id] > 0 and block_id != NULL_BLOCK_ID, "can share only held blocks"
            ref_counts[block_id] += 1
        req.block_ids.extend(block_ids)

    def free(self, req: EngineRequest) -> None:
        """Releases all of `req`'s blocks (each returns to the stack once nobody holds it)."""
        ref_counts = self.ref_counts
        free_ids = self._free_block_ids
        # Head first, so the tail ends on top of the stack and is reused first: the head
        # blocks are the ones a prefix cache will want to keep longest.
        for block_id in req.block_ids:
            count = ref_counts[block_id] - 1
            assert count >= 0, f"block {block_id} freed more often than held"
            ref_counts[block_id] = count
            if count == 0:
                free_ids.append(block_id)
        # A new list rather than clear(): a step in flight may still read the old block table.
        req.block_ids = []
