"""A model with sliding and global layers (Gemma 2/3, GPT-OSS): the sliding layers' KV blocks in window
tables of their own (engine_proc/sched/window_tables.py), drawn from the one pool of blocks, holding a
request's window only, counted by the scheduler, and serving prefix-cache hits as far as their window
is cached."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import Gemma3TextConfig

from rill.engine_proc.attention.kv_cache import KVCache
from rill.engine_proc.attention.kv_layout import num_blocks_for_memory
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.sched.block_manager import NULL_BLOCK_ID, BlockManager
from rill.engine_proc.sched.request import RequestState
from rill.engine_proc.sched.scheduler import Scheduler
from rill.engine_proc.sched.window_tables import layer_groups
from tests.helpers.prefix_blocks import BS, ids, make_req
from tests.helpers.scheduling import EOS, PagedFakeModel, collect, reference_output
from tests.helpers.scheduling import make_req as make_sized_req

WINDOW = 6  # tokens; BS (4) tokens a block
MOST_HELD = -(-(WINDOW - 1) // BS) + 1  # a table's blocks after a step: the window's and the last one's


def hybrid(num_blocks: int = 64, num_groups: int = 2, caching: bool = True) -> BlockManager:
    return BlockManager(num_blocks, BS, enable_prefix_caching=caching, window=(WINDOW, num_groups))


def step_to(bm: BlockManager, req, num_computed: int) -> None:
    bm.allocate(req, num_computed)
    req.num_computed_tokens = num_computed
    bm.after_step(req)


def test_the_sliding_layers_hold_their_window_while_the_global_ones_keep_every_block():
    bm = hybrid()
    req = make_req("a", ids(100, 40))
    assert bm.num_blocks_needed(req, 9) == 3 + 2 * 3  # the global table's and both groups'
    step_to(bm, req, 9)  # the next query at 9 sees keys 4..9: window block 0 (positions 0-3) is out
    assert [len(t) for t in req.window_block_ids] == [3, 3] and len(req.block_ids) == 3
    assert all(t[0] == NULL_BLOCK_ID for t in req.window_block_ids) and bm.window.held_blocks(req) == 2 * 2
    held = set(req.block_ids) | {b for t in req.window_block_ids for b in t if b}
    assert len(held) == 3 + 4 and bm.num_free_blocks() == 63 - 7  # one pool, each block in one table
    for end in range(10, 31):  # one decode step at a time
        assert bm.num_blocks_needed(req, end) == (3 if end % BS == 1 else 0)
        step_to(bm, req, end)
        assert bm.window.held_blocks(req) <= 2 * MOST_HELD
    assert all(t[:6] == [NULL_BLOCK_ID] * 6 for t in req.window_block_ids) and bm.held_blocks(req) == 8
    assert bm.num_free_blocks() == 63 - 8 - bm.window.held_blocks(req)
    bm.free(req)
    assert bm.num_free_blocks() == 63 and bm.ref_counts[NULL_BLOCK_ID] == 1 and not any(bm.ref_counts[1:])


def test_a_hit_shares_the_window_blocks_before_its_end_and_nulls_the_rest():
    bm = hybrid()
    prompt = ids(100, 22)
    first = make_req("a", prompt)
    bm.allocate(first, 22)
    tables = first.window_block_ids
    first.num_computed_tokens = 22
    bm.after_step(first)  # 5 full blocks, registered; window entries 0-3 released (cached, free)
    assert first.window_block_ids == [[NULL_BLOCK_ID] * 4 + t[4:] for t in tables]
    later = make_req("b", prompt + [7])
    found = bm.find_cached_blocks(later, 5)
    assert found == first.block_ids[:5]
    free_before = bm.num_free_blocks()
    # its global blocks are held, window entry 3 of each group sits free: 2 revived, 6 new (2 per table)
    assert bm.num_blocks_to_admit(later, found, 27) == 2 + 2 * 3
    bm.share(later, found)
    bm.allocate(later, 27)
    assert bm.num_free_blocks() == free_before - 8
    # the first query after the hit is at 20: it sees keys 15..20, entries 3 and 4 of each group
    assert [t[:5] for t in later.window_block_ids] == [[NULL_BLOCK_ID] * 3 + t[3:5] for t in tables]
    assert all(bm.ref_counts[t[3]] == 1 and bm.ref_counts[t[4]] == 2 for t in tables)  # 4: held by both
    bm.free(later)
    bm.free(first)
    assert bm.num_free_blocks() == 63 and not any(bm.ref_counts[1:])


def test_a_reset_forgets_the_window_blocks_too():
    bm = hybrid()
    prompt = ids(100, 22)
    first = make_req("a", prompt)
    step_to(bm, first, 22)
    bm.reset_prefix_cache()
    assert bm.find_cached_blocks(make_req("b", prompt + [7]), 5) == []
    assert bm.num_free_blocks() == 63 - bm.held_blocks(first) - bm.window.held_blocks(first)
    bm.free(first)
    assert bm.num_free_blocks() == 63 and bm.prefix_cache.num_evictable() == 0  # every block on the plain stack


@pytest.mark.parametrize("num_taken, num_hits", [(1, 3), (2, 2), (4, 0)])
def test_a_hit_stops_where_the_window_blocks_before_it_were_evicted(num_taken, num_hits):
    bm = hybrid(num_blocks=19, num_groups=1)
    prompt = ids(100, 22)
    first = make_req("a", prompt)
    step_to(bm, first, 22)  # 6 window blocks, then 6 global ones; 5 full of each cached
    bm.free(first)
    # Free now: 8 never cached, then the cached ones by age: window entries 3, 2, 1, 0 (released tail
    # first), then the global blocks. Taking 8 + n evicts the n oldest.
    bm.take(8 + num_taken)
    later = make_req("b", prompt + [7])
    assert len(bm.prefix_cache.find(later, 5)) == 5  # the global layers' blocks are all there
    # A start after n blocks needs window entries first_needed(4n) .. n-1: after 5 or 4, entry 3; after
    # 3, entries 1-2; after 2, entries 0-1; after 1, entry 0.
    assert len(bm.find_cached_blocks(later, 5)) == num_hits


def test_the_scheduler_counts_the_window_tables_under_a_random_workload():
    """Requests arriving, aborted and preempted at random through the real scheduler, one pool for the
    global table and two sliding groups': a fake model writes each token's history into its slots and
    reads back every key of each sampled token's window in each group, so a wrong table, a freed block
    still read, or a bad prefix hit would feed it another history; the pool's own asserts catch a
    step that takes more blocks than the scheduler counted."""
    rng = random.Random(7)
    bm = hybrid(num_blocks=40)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=1024, eos_token_ids=[EOS])
    assert sched._cache_len == (39 - 2 * (-(-(WINDOW - 1 + 8) // BS) + 2)) * BS  # more than 39 // 3 blocks
    model = PagedFakeModel(BS, bm)
    pending = [make_sized_req(f"r{i}", prompt_len=rng.randint(1, 30), max_tokens=rng.randint(1, 20),
                              ignore_eos=True) for i in range(40)]
    reqs, aborted, streamed, finishes = list(pending), set(), {}, {}
    for _ in range(5000):
        if not pending and not sched.has_work:
            break
        for _ in range(rng.randint(0, 2)):
            if pending:
                sched.add(pending.pop(0))
        if rng.random() < 0.03 and (victim := rng.choice(reqs)) and sched.abort(victim.req_id) is not None:
            aborted.add(victim.req_id)
        batch = sched.schedule()
        sampled = model.run(batch)
        check_windows(batch, model.slots, bm)
        collect(sched.update(batch, sampled), streamed, finishes)
        held = {b for r in reqs for b in r.block_ids + [b for t in r.window_block_ids for b in t]} - {NULL_BLOCK_ID}
        assert len(held) + bm.num_free_blocks() == bm.num_total_blocks()
        for req in reqs:
            if req.state is RequestState.RUNNING:
                assert bm.window.held_blocks(req) <= 2 * MOST_HELD
    else:
        pytest.fail("did not drain")
    assert bm.num_free_blocks() == bm.num_total_blocks() and not any(bm.ref_counts[1:])
    assert sched.num_preemptions > 0 and sched.num_prefix_hit_tokens > 0
    for req in reqs:
        if req.req_id not in aborted:
            assert req.output_ids == reference_output(req.prompt_ids, req.params.max_tokens)


def check_windows(batch: Batch, slots: dict, bm: BlockManager) -> None:
    """Writes each new token's history into its slot of every window table; checks that each sampled
    token's window of keys holds the right histories in every group."""
    for seq in batch.seqs:
        for table in seq.req.window_block_ids:
            for pos, token_id in enumerate(seq.token_ids, seq.start_pos):
                block_id = table[pos // BS]
                assert block_id != NULL_BLOCK_ID and bm.ref_counts[block_id] == 1, "a write into a shared or null block"
                slots[(block_id, pos % BS)] = tuple(seq.req.token_ids(0, pos)) + (token_id,)
    for seq in batch.sampled_seqs:
        end = seq.start_pos + seq.num_new_tokens
        assert len(seq.req.window_block_ids) == 2
        for table in seq.req.window_block_ids:
            for pos in range(max(0, end - WINDOW), end):  # every key of the last query's window
                history = slots[(table[pos // BS], pos % BS)]
                assert list(history) == seq.req.token_ids(0, pos + 1), "a window table holds another history"


def test_the_cache_is_as_many_tensors_as_global_layers_shared_by_the_sliding_groups():
    # Gemma 3's pattern: 5 sliding layers to a global one
    assert layer_groups((0, 1, 2, 3, 4), 6) == (5, [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (0, 0)])
    sliding = tuple(i for i in range(12) if i % 6 != 5)
    groups, places = layer_groups(sliding, 12)
    assert groups == 5 and places[5] == (0, 0) and places[11] == (0, 1) and places[0] == (1, 0) and places[10] == (5, 1)
    assert layer_groups((0, 2), 4) == (1, [(1, 0), (0, 0), (1, 1), (0, 1)])  # alternating: one group
    config = Gemma3TextConfig(hidden_size=64, num_hidden_layers=12, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=32, sliding_window=16, vocab_size=100)
    memory = 50 * 12 * (2 * 16 * 32 * 2)  # 50 blocks of every layer's K and V
    assert num_blocks_for_memory(config, torch.bfloat16, 16, memory) == 50
    assert num_blocks_for_memory(config, torch.bfloat16, 16, memory, 2) == 300  # of 2 tensors: 6x the blocks
    cache = KVCache(config, num_blocks=64, block_size=16, dtype=torch.bfloat16, window_layers=sliding)
    assert cache.num_window_groups == 5 and cache.num_bytes == 2 * 2 * 64 * 16 * 32 * 2
    # layer 5 (global) and 0 and 2 (sliding groups 1 and 2) share tensor 0; 11, 1 and 6 tensor 1
    assert cache.k_caches[0].data_ptr() == cache.k_caches[5].data_ptr() == cache.k_caches[2].data_ptr()
    assert cache.k_caches[11].data_ptr() == cache.k_caches[6].data_ptr() == cache.k_caches[1].data_ptr()
    assert cache.k_caches[0].data_ptr() != cache.k_caches[1].data_ptr()
