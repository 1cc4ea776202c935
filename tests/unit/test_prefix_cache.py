"""Prefix caching: the chained-hash index, LRU eviction, sharing (block manager level)."""
from __future__ import annotations

from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.prefix_cache import ROOT_HASH
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.prefix_blocks import BS, ids, make_req
from tests.helpers.scheduling import PagedFakeModel, make_scheduler, run_until_done


def computed(bm: BlockManager, req: EngineRequest) -> EngineRequest:
    """Gives req blocks for all its tokens and enters them as computed, as a step would."""
    bm.allocate(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    bm.after_step(req)
    return req


class RecordingHash:
    def __init__(self, hash_fn=hash) -> None:
        self.hash_fn = hash_fn
        self.keys: list = []

    def __call__(self, key) -> int:
        self.keys.append(key)
        return self.hash_fn(key)


# ---- the index -------------------------------------------------------------------------------


def test_block_hashes_chain_over_full_blocks_only() -> None:
    recorder = RecordingHash()
    bm = BlockManager(10, BS, hash_fn=recorder)
    prompt = ids(100, 10)  # two full blocks and two tokens
    computed(bm, make_req("a", prompt))
    first = (ROOT_HASH, tuple(prompt[0:4]))
    assert recorder.keys == [first, (hash(first), tuple(prompt[4:8]))]
    assert bm.prefix_cache.num_cached_blocks() == 2  # the partial third block is not entered

    recorder.keys.clear()
    assert bm.find_cached_blocks(make_req("b", prompt), 2) != []
    assert recorder.keys == [first, (hash(first), tuple(prompt[4:8]))]  # the same keys find them


def test_hits_the_longest_cached_prefix_of_full_blocks() -> None:
    bm = BlockManager(20, BS)
    a = computed(bm, make_req("a", ids(100, 12)))  # three full blocks
    find = bm.find_cached_blocks
    assert find(make_req("same", ids(100, 13)), 3) == a.block_ids
    assert find(make_req("capped", ids(100, 13)), 1) == a.block_ids[:1]
    assert find(make_req("diverges-in-block-2", ids(100, 8) + [7, 7, 7, 7]), 3) == a.block_ids[:2]
    assert find(make_req("diverges-in-block-0", [1] + ids(101, 11)), 3) == []
    assert find(make_req("shorter", ids(100, 6)), 1) == a.block_ids[:1]


def test_generated_tokens_are_cached_once_their_block_is_full() -> None:
    sched = make_scheduler(block_size=BS)
    a = make_req("a", ids(100, 6), max_tokens=7)
    sched.add(a)
    run_until_done(sched, PagedFakeModel(BS, sched.block_manager))
    # 6 + 7 tokens, of which 12 were computed (the last sampled one never is): 3 full blocks.
    multi_turn = make_req("b", a.prompt_ids + a.output_ids + [1, 2, 3])
    assert len(sched.block_manager.find_cached_blocks(multi_turn, 10)) == 3


def test_a_hash_collision_never_serves_another_blocks_kv() -> None:
    bm = BlockManager(20, BS, hash_fn=lambda key: 0)  # every block collides with every other
    find = bm.find_cached_blocks
    d = computed(bm, make_req("d", ids(200, 4)))
    assert find(make_req("b", ids(200, 8)), 2) == d.block_ids  # block 1 finds d's block: a miss
    assert find(make_req("c", ids(300, 8)), 2) == []
    # The one key holds one block at a time, the newest: a's block 1 pushes out a's block 0
    # (and d's before it), and without block 0 nothing of a is found; nothing wrong either.
    computed(bm, make_req("a", ids(100, 8)))
    assert bm.prefix_cache.num_cached_blocks() == 1
    assert find(make_req("a2", ids(100, 8)), 2) == []
    assert find(make_req("a3", ids(104, 4)), 1) == []  # a's block 1 alone: right tokens, wrong parent
    assert find(make_req("d2", ids(200, 8)), 2) == []


def test_equal_tokens_after_another_prefix_are_not_a_hit() -> None:
    # A hash blind to the parent makes block 1 of "x+y" collide with block 1 of "z+y"; its
    # own tokens match, so only the check of its parent entry stands between z+y and x's KV.
    bm = BlockManager(20, BS, hash_fn=lambda key: hash(key[1]))
    x, y, z = ids(100, 4), ids(200, 4), ids(300, 4)
    computed(bm, make_req("xy", x + y))
    zw = computed(bm, make_req("zw", z + ids(400, 4)))
    assert bm.find_cached_blocks(make_req("zy", z + y), 2) == zw.block_ids[:1]


# ---- sharing, freeing, evicting -------------------------------------------------------------------


def test_shared_blocks_are_counted_and_stay_cached_when_freed() -> None:
    bm = BlockManager(9, BS)  # 8 usable
    a = computed(bm, make_req("a", ids(100, 10)))  # 3 blocks, 2 of them full
    b = make_req("b", ids(100, 9))
    hits = bm.find_cached_blocks(b, 2)
    assert hits == a.block_ids[:2] and bm.num_free_among(hits) == 0
    bm.share(b, hits)
    bm.allocate(b, 9)
    assert [bm.ref_counts[i] for i in b.block_ids] == [2, 2, 1]
    assert bm.num_free_blocks() == 4

    bm.free(a)
    assert [bm.ref_counts[i] for i in hits] == [1, 1]
    assert bm.num_free_blocks() == 5  # a's partial block only
    bm.free(b)
    assert bm.num_free_blocks() == bm.num_total_blocks()  # cached blocks count as free
    assert all(count == 0 for count in bm.ref_counts[1:])
    assert bm.find_cached_blocks(make_req("c", ids(100, 9)), 2) == hits  # and are still found


def test_sharing_a_free_cached_block_takes_it_off_the_free_list() -> None:
    bm = BlockManager(5, BS)  # 4 usable
    a = computed(bm, make_req("a", ids(100, 8)))
    cached = list(a.block_ids)
    bm.free(a)
    b = make_req("b", ids(100, 9))
    hits = bm.find_cached_blocks(b, 2)
    assert hits == cached and bm.num_free_among(hits) == 2
    bm.share(b, hits)
    assert bm.num_free_blocks() == 2
    other = make_req("other", ids(500, 8))
    bm.allocate(other, 8)  # every free block: none of them b's
    assert not set(other.block_ids) & set(cached)
    assert not bm.can_allocate(1)


def test_free_blocks_are_evicted_least_recently_used_first_tail_before_head() -> None:
    bm = BlockManager(7, BS)  # 6 usable
    a = computed(bm, make_req("a", ids(100, 8)))
    b = computed(bm, make_req("b", ids(200, 8)))
    a_ids, b_ids = list(a.block_ids), list(b.block_ids)
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks() == 6

    c = make_req("c", ids(300, 12))
    bm.allocate(c, 12)  # the 2 never-cached blocks first, then the oldest cached one: a's tail
    assert a_ids[1] in c.block_ids and a_ids[0] not in c.block_ids
    assert bm.find_cached_blocks(make_req("a", ids(100, 8)), 2) == a_ids[:1]
    assert bm.find_cached_blocks(make_req("b", ids(200, 8)), 2) == b_ids

    d = make_req("d", ids(400, 4))
    bm.allocate(d, 4)
    assert d.block_ids == a_ids[:1]
    assert bm.find_cached_blocks(make_req("a", ids(100, 8)), 2) == []

    # A hit refreshes: b's blocks, shared and freed again, are now younger than none else, and
    # the next eviction still takes b's tail before its head.
    e = make_req("e", ids(200, 8))
    bm.share(e, bm.find_cached_blocks(e, 2))
    bm.free(e)
    f = make_req("f", ids(500, 4))
    bm.allocate(f, 4)
    assert f.block_ids == b_ids[1:]


def test_a_reset_forgets_every_block_and_frees_the_free_ones() -> None:
    """--enable-cache-reset: free cached blocks become plain free blocks, held ones stay held but are found no more,
    a running request's next full blocks are not entered, and its blocks go to the plain stack when freed."""
    bm = BlockManager(9, BS)  # 8 usable
    a = computed(bm, make_req("a", ids(100, 8)))
    bm.free(a)  # 2 free cached blocks
    b = computed(bm, make_req("b", ids(200, 5)))  # 1 held cached block, 1 partial
    assert bm.prefix_cache.num_cached_blocks() == 3 and bm.num_free_blocks() == 6
    assert bm.reset_prefix_cache() == 3
    assert bm.prefix_cache.num_cached_blocks() == 0 and bm.prefix_cache.num_evictable() == 0
    assert bm.num_free_blocks() == 6  # the free ones are free still
    assert bm.find_cached_blocks(make_req("a2", ids(100, 9)), 2) == []
    assert bm.find_cached_blocks(make_req("b2", ids(200, 9)), 1) == []
    bm.allocate(b, 8)
    b.num_computed_tokens = 8
    bm.after_step(b)  # its second block is full now: its chain broke at the reset, so it is not cached
    assert bm.prefix_cache.num_cached_blocks() == 0
    bm.free(b)
    assert bm.num_free_blocks() == bm.num_total_blocks() and bm.prefix_cache.num_evictable() == 0
    c = computed(bm, make_req("c", ids(100, 8)))  # caching goes on as before
    c_ids = list(c.block_ids)
    bm.free(c)
    assert bm.find_cached_blocks(make_req("c2", ids(100, 9)), 2) == c_ids
    assert BlockManager(9, BS, enable_prefix_caching=False).reset_prefix_cache() == 0


def test_prefix_caching_off_finds_and_keeps_nothing() -> None:
    bm = BlockManager(9, BS, enable_prefix_caching=False)
    a = computed(bm, make_req("a", ids(100, 8)))
    assert not bm.enable_prefix_caching and bm.prefix_cache is None
    assert bm.find_cached_blocks(make_req("b", ids(100, 9)), 2) == []
    bm.free(a)
    assert bm.num_free_blocks() == bm.num_total_blocks()


# ---- KV-cache events (--kv-events-endpoint) ----------------------------------------------------


def test_the_cache_records_stored_and_removed_blocks_in_order() -> None:
    bm = BlockManager(4, BS, record_events=True)  # three usable blocks
    a = computed(bm, make_req("a", ids(100, 8)))  # two full blocks: stored, the second chained to the first
    stored = bm.prefix_cache.take_events()
    first = hash((ROOT_HASH, tuple(ids(100, 4))))
    assert stored == [("stored", first, None, tuple(ids(100, 4)), "", 0),  # the base model: no adapter
                      ("stored", hash((first, tuple(ids(104, 4)))), first, tuple(ids(104, 4)), "", 0)]
    assert bm.prefix_cache.take_events() == []
    bm.free(a)  # evictable, still cached: no event
    assert bm.prefix_cache.take_events() == []
    computed(bm, make_req("b", ids(200, 12)))  # three blocks: one from the stack, two evicted (tail first)
    events = bm.prefix_cache.take_events()
    removed = [e for e in events if e[0] == "removed"]
    assert removed == [("removed", stored[1][1]), ("removed", first)]
    assert [e[0] for e in events].count("stored") == 3
    assert bm.prefix_cache.num_cached_blocks() == 3


def test_no_events_are_kept_unless_asked() -> None:
    bm = BlockManager(4, BS)
    computed(bm, make_req("a", ids(100, 8)))
    assert bm.prefix_cache.events is None and bm.prefix_cache.take_events() == []


def test_blocks_are_keyed_by_lora_adapter() -> None:
    """The same tokens under another adapter (or none) are other K/V: no hit across adapters."""
    bm = BlockManager(20, BS)

    def req(req_id: str, lora: str) -> EngineRequest:
        return EngineRequest(req_id, "w0", ids(100, 12), SamplingParams(max_tokens=4, lora=lora))

    computed(bm, req("base", ""))
    computed(bm, req("a", "adapter-a"))
    assert len(bm.find_cached_blocks(req("b", "adapter-b"), 3)) == 0
    assert len(bm.find_cached_blocks(req("a2", "adapter-a"), 3)) == 3
    assert len(bm.find_cached_blocks(req("base2", ""), 3)) == 3
    assert bm.prefix_cache.num_cached_blocks() == 6  # both copies cached, side by side


def test_blocks_are_keyed_by_adapter_load_not_name() -> None:
    """An adapter unloaded and loaded again under its name (or replaced in place) has new weights:
    its requests carry the new load id, and never find the blocks computed with the old ones."""
    bm = BlockManager(20, BS)

    def req(req_id: str, load_id: int) -> EngineRequest:
        r = EngineRequest(req_id, "w0", ids(100, 12), SamplingParams(max_tokens=4, lora="x"))
        r.lora_load_id = load_id
        return r

    computed(bm, req("old", 1))
    assert len(bm.find_cached_blocks(req("same-load", 1), 3)) == 3
    assert len(bm.find_cached_blocks(req("reloaded", 2), 3)) == 0
