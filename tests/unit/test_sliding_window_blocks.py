"""A model whose every layer slides: the block manager releases the blocks no later query can reach."""
from __future__ import annotations

import pytest

from rill.engine_proc.sched.block_manager import NULL_BLOCK_ID, BlockManager
from tests.helpers.prefix_blocks import BS, ids, make_req

WINDOW = 6  # tokens; BS (4) tokens a block


def step_to(bm: BlockManager, req, num_computed: int) -> None:
    bm.allocate(req, num_computed)
    req.num_computed_tokens = num_computed
    bm.after_step(req)


@pytest.mark.parametrize("caching", [False, True])
def test_blocks_behind_the_window_are_released_and_the_table_keeps_its_length(caching):
    bm = BlockManager(16, BS, enable_prefix_caching=caching, sliding_window=WINDOW)
    req = make_req("a", ids(100, 40))
    step_to(bm, req, 9)  # the next query at 9 sees keys 4..9: block 0 (positions 0-3) is out
    assert req.block_ids[0] == NULL_BLOCK_ID and len(req.block_ids) == 3
    assert bm.held_blocks(req) == 2 and bm.num_free_blocks() == 15 - 2
    step_to(bm, req, 30)  # keys 25..30: blocks 0-5 (positions 0-23) out, 6 and 7 held
    assert req.block_ids[:6] == [NULL_BLOCK_ID] * 6 and bm.held_blocks(req) == 2
    assert bm.num_free_blocks() == 15 - 2
    bm.free(req)
    assert bm.num_free_blocks() == 15 and bm.ref_counts[NULL_BLOCK_ID] == 1  # the null block stays pinned


def test_a_released_cached_block_is_found_again_by_a_later_request():
    bm = BlockManager(16, BS, sliding_window=WINDOW)
    prompt = ids(100, 20)
    first = make_req("a", prompt)
    step_to(bm, first, 20)
    held = [b for b in first.block_ids if b != NULL_BLOCK_ID]
    released = {b for b in range(1, 16) if bm.ref_counts[b] == 0 and bm.prefix_cache.is_cached(b)}
    assert len(released) == 3 and len(held) == 2  # blocks 0-2 (positions 0-11) fell out of the window
    found = bm.find_cached_blocks(make_req("b", prompt + [7]), 5)
    assert set(found[:3]) == released and found[3:] == held  # the chain of all five full blocks


def test_without_a_window_nothing_is_released():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    req = make_req("a", ids(100, 40))
    step_to(bm, req, 30)
    assert NULL_BLOCK_ID not in req.block_ids and bm.held_blocks(req) == 8
