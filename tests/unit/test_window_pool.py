"""A model with sliding and global layers (Gemma 2/3, GPT-OSS): the sliding layers' KV blocks in a pool of
their own (engine_proc/sched/window_pool.py), which holds a request's window only, never runs out at the
size window_pool_size() gives it, and serves prefix-cache hits as far as their window is cached."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import Gemma3TextConfig

from rill.engine_proc.attention.kv_cache import KVCache, bytes_per_block, split_blocks_for_memory
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.sched.block_manager import NULL_BLOCK_ID, BlockManager
from rill.engine_proc.sched.request import RequestState
from rill.engine_proc.sched.scheduler import Scheduler
from rill.engine_proc.sched.window_pool import WindowPool, window_pool_size
from tests.helpers.prefix_blocks import BS, ids, make_req
from tests.helpers.scheduling import EOS, collect, fake_next, reference_output
from tests.helpers.scheduling import make_req as make_sized_req

WINDOW = 6  # tokens; BS (4) tokens a block


def hybrid(num_blocks: int = 32, num_window_blocks: int | None = None, caching: bool = True) -> BlockManager:
    return BlockManager(num_blocks, BS, enable_prefix_caching=caching,
                        window=WindowPool(num_window_blocks or num_blocks, BS, WINDOW))


def step_to(bm: BlockManager, req, num_computed: int) -> None:
    bm.allocate(req, num_computed)
    req.num_computed_tokens = num_computed
    bm.after_step(req)


def test_the_sliding_layers_hold_their_window_while_the_global_ones_keep_every_block():
    bm = hybrid()
    req = make_req("a", ids(100, 40))
    step_to(bm, req, 9)  # the next query at 9 sees keys 4..9: window block 0 (positions 0-3) is out
    assert len(req.window_block_ids) == len(req.block_ids) == 3
    assert req.window_block_ids[0] == NULL_BLOCK_ID and bm.window.held_blocks(req) == 2
    assert NULL_BLOCK_ID not in req.block_ids
    for end in range(10, 31):  # one decode step at a time
        step_to(bm, req, end)
        assert bm.window.held_blocks(req) <= -(-(WINDOW - 1) // BS) + 1
    assert req.window_block_ids[:6] == [NULL_BLOCK_ID] * 6 and bm.held_blocks(req) == 8
    assert bm.window.num_free_blocks() == 31 - bm.window.held_blocks(req)
    bm.free(req)
    assert bm.window.num_free_blocks() == bm.num_free_blocks() == 31
    assert bm.window.ref_counts[NULL_BLOCK_ID] == 1 and not any(bm.window.ref_counts[1:])


def test_a_hit_shares_the_window_blocks_before_its_end_and_nulls_the_rest():
    bm = hybrid()
    prompt = ids(100, 22)
    first = make_req("a", prompt)
    bm.allocate(first, 22)
    table = first.window_block_ids
    first.num_computed_tokens = 22
    bm.after_step(first)  # 5 full blocks, registered; window blocks 0-3 released (cached, free)
    assert first.window_block_ids == [NULL_BLOCK_ID] * 4 + table[4:]
    later = make_req("b", prompt + [7])
    found = bm.find_cached_blocks(later, 5)
    assert found == first.block_ids[:5]
    bm.share(later, found)
    # the first query after the hit is at 20: it sees keys 15..20, blocks 3 and 4 of the window pool
    assert later.window_block_ids == [NULL_BLOCK_ID] * 3 + table[3:5]
    assert bm.window.ref_counts[table[3]] == 1 and bm.window.ref_counts[table[4]] == 2  # 4: held by both
    bm.allocate(later, 23)
    assert len(later.window_block_ids) == len(later.block_ids) == 6
    bm.free(later)
    bm.free(first)
    assert bm.window.num_free_blocks() == 31 and not any(bm.window.ref_counts[1:])


@pytest.mark.parametrize("num_taken, num_hits", [(3, 3), (7, 0)])
def test_a_hit_stops_where_the_window_blocks_before_it_were_evicted(num_taken, num_hits):
    bm = hybrid(num_window_blocks=8)
    prompt = ids(100, 22)
    first = make_req("a", prompt)
    step_to(bm, first, 22)  # window blocks 1-6; those of positions 0-19 cached
    bm.free(first)  # free: 2 never cached (blocks 6 and 7), then the cached ones, by age: positions 12-15 oldest
    bm.allocate(make_req("x", ids(500, 4 * num_taken)), 4 * num_taken)  # the 2, then the oldest cached ones
    later = make_req("b", prompt + [7])
    assert len(bm.prefix_cache.find(later, 5)) == 5  # the global layers' blocks are all there
    # After 3 taken, positions 12-15 went: a start at 20 or 16 needs them; at 12 it needs 4-11, still cached.
    # After 7, every one went.
    assert bm.find_cached_blocks(later, 5) == first.block_ids[:num_hits] if first.block_ids else True
    assert [b for b in bm.find_cached_blocks(later, 5)] == bm.prefix_cache.find(later, 5)[:num_hits]


def test_the_window_pool_never_runs_out_at_its_size_under_a_random_workload():
    """Requests arriving, aborted and preempted at random through the real scheduler, the window pool
    sized by window_pool_size() (smaller than the global pool): a fake model writes each token's
    history into its window slot and reads back every key of each sampled token's window, so a wrong
    table, a freed block still read, or a bad prefix hit would feed it another history."""
    rng = random.Random(7)
    max_num_seqs, budget = 2, 8
    num_blocks = 14
    size = window_pool_size(WINDOW, BS, max_num_seqs, budget, num_blocks)
    assert size < num_blocks
    bm = BlockManager(num_blocks, BS, window=WindowPool(size, BS, WINDOW))
    sched = Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=1024,
                      eos_token_ids=[EOS])
    slots: dict[tuple[int, int], tuple[int, ...]] = {}
    pending = [make_sized_req(f"r{i}", prompt_len=rng.randint(1, 30), max_tokens=rng.randint(1, 20),
                              ignore_eos=True) for i in range(40)]
    reqs, aborted, streamed, finishes = list(pending), set(), {}, {}
    low_water = size
    for _ in range(5000):
        if not pending and not sched.has_work:
            break
        for _ in range(rng.randint(0, 2)):
            if pending:
                sched.add(pending.pop(0))
        if rng.random() < 0.03 and (victim := rng.choice(reqs)) and sched.abort(victim.req_id) is not None:
            aborted.add(victim.req_id)
        batch = sched.schedule()
        low_water = min(low_water, bm.window.num_free_blocks())
        collect(sched.update(batch, window_model(batch, slots, bm.window)), streamed, finishes)
        for req in reqs:
            if req.state is RequestState.RUNNING:
                assert bm.window.held_blocks(req) <= -(-(WINDOW - 1) // BS) + 1
    else:
        pytest.fail("did not drain")
    assert bm.window.num_free_blocks() == size - 1 and not any(bm.window.ref_counts[1:])
    assert sched.num_preemptions > 0 and sched.num_prefix_hit_tokens > 0
    assert low_water < size // 2  # the pool was used, not merely big
    for req in reqs:
        if req.req_id not in aborted:
            assert req.output_ids == reference_output(req.prompt_ids, req.params.max_tokens)


def window_model(batch: Batch, slots: dict, pool: WindowPool) -> list[int]:
    """Writes each new token's history into its window slot; samples from the histories of the last
    token's window of keys, each checked."""
    for seq in batch.seqs:
        table = seq.req.window_block_ids
        for pos, token_id in enumerate(seq.token_ids, seq.start_pos):
            block_id = table[pos // BS]
            assert block_id != NULL_BLOCK_ID and pool.ref_counts[block_id] == 1, "a write into a shared or null block"
            slots[(block_id, pos % BS)] = tuple(seq.req.token_ids(0, pos)) + (token_id,)
    sampled = []
    for seq in batch.sampled_seqs:
        end = seq.start_pos + seq.num_new_tokens
        table = seq.req.window_block_ids
        for pos in range(max(0, end - WINDOW), end):  # every key of the last query's window
            history = slots[(table[pos // BS], pos % BS)]
            assert list(history) == seq.req.token_ids(0, pos + 1), "the window's cache holds another history"
        sampled.append(fake_next(seq.req.token_ids(0, end)))
    return sampled


def test_memory_is_split_so_the_window_pool_holds_what_it_needs_and_the_global_layers_the_rest():
    config = Gemma3TextConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=32, sliding_window=16, vocab_size=100)
    per_layer = bytes_per_block(config, torch.bfloat16, 16, 1)
    memory = 1000 * per_layer * 6  # 1000 blocks of every layer
    assert split_blocks_for_memory(config, torch.bfloat16, 16, memory, 5, lambda n: n) == (1000, 1000)
    num_global, num_window = split_blocks_for_memory(config, torch.bfloat16, 16, memory, 5, lambda n: min(n, 200))
    assert num_window == 200 and num_global == (6000 - 5 * 200)  # one global layer: 5000 blocks
    cache = KVCache(config, num_blocks=num_global, block_size=16, dtype=torch.bfloat16, window_layers=(0, 1, 2, 3, 4),
                    num_window_blocks=num_window)
    assert cache.num_bytes <= memory and cache.k_caches[5].shape[0] == 5000 and cache.v_caches[0].shape[0] == 200
    # at the default scale a window pool is a few blocks a request, not the context's
    assert window_pool_size(4096, 16, 256, 2048, 10**6) == 256 * (256 + 3) + 128 + 1
