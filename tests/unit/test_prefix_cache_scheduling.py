"""Prefix caching in the scheduler (pure) and with the real model: hits, back-off, no shared writes."""
from __future__ import annotations

import pytest

from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest, RequestState
from rill.ipc.protocol import FinishReason, SamplingParams
from tests.helpers.prefix_blocks import BS, ids, make_req, written_block_ids
from tests.helpers.runners import make_runner
from tests.helpers.scheduling import (
    PagedFakeModel,
    assert_all_blocks_free,
    make_scheduler,
    reference_output,
    run_random_workload,
    run_until_done,
    shape,
    step,
)

# ---- the scheduler ----------------------------------------------------------------------------------


def test_a_request_starts_after_its_cached_prefix() -> None:
    sched = make_scheduler(block_size=BS)
    model = PagedFakeModel(BS, sched.block_manager)
    a = make_req("a", ids(100, 10))
    sched.add(a)
    run_until_done(sched, model)
    b = make_req("b", ids(100, 9) + [7, 7])
    sched.add(b)
    batch, _ = step(sched, model=model)
    assert shape(batch) == [("b", 8, 3)]
    assert b.num_computed_tokens == 11 and b.num_cached_tokens == 8
    run_until_done(sched, model)
    assert b.output_ids == reference_output(b.prompt_ids, 4)
    assert (sched.num_prefix_queries_tokens, sched.num_prefix_hit_tokens) == (10 + 11, 8)
    assert_all_blocks_free(sched)


def test_a_request_hits_the_blocks_of_one_still_running() -> None:
    sched = make_scheduler(block_size=BS)
    model = PagedFakeModel(BS, sched.block_manager)
    a = make_req("a", ids(100, 9), max_tokens=10)
    sched.add(a)
    step(sched, model=model)  # a's prefill: its 2 full blocks are entered at once
    b = make_req("b", ids(100, 9), max_tokens=10)
    sched.add(b)
    batch, _ = step(sched, model=model)
    assert shape(batch) == [("a", 9, 1), ("b", 8, 1)]
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    assert [sched.block_manager.ref_counts[i] for i in b.block_ids] == [2, 2, 1]
    run_until_done(sched, model)
    assert a.output_ids == b.output_ids == reference_output(a.prompt_ids, 10)
    assert_all_blocks_free(sched)


@pytest.mark.parametrize(
    ("prompt_len", "expected_shape"),
    [
        (8, ("b", 4, 4)),  # all of it cached: the last block is recomputed, not shared
        (9, ("b", 8, 1)),  # the last token starts a block of its own
        (4, ("b", 0, 4)),  # a one-block prompt never hits
        (3, ("b", 0, 3)),
    ],
)
def test_never_the_whole_prompt_and_never_its_last_block(prompt_len: int, expected_shape) -> None:
    sched = make_scheduler(block_size=BS)
    model = PagedFakeModel(BS, sched.block_manager)
    sched.add(make_req("a", ids(100, 12)))
    run_until_done(sched, model)
    b = make_req("b", ids(100, prompt_len))
    sched.add(b)
    batch, deltas = step(sched, model=model)
    assert shape(batch) == [expected_shape]
    assert [d.req for d in deltas] == [b]  # the prompt's last token was computed and sampled
    for block_id in b.block_ids[expected_shape[1] // BS :]:
        assert sched.block_manager.ref_counts[block_id] == 1


def test_no_step_writes_into_a_shared_block() -> None:
    # Staggered copies of one prompt with small budgets: chunks start on and off block edges,
    # some requests hit while the owner still prefills, some dedupe a block computed twice.
    sched = make_scheduler(num_blocks=40, block_size=BS, max_num_batched_tokens=7, watermark_blocks=0)
    bm = sched.block_manager
    prompt = ids(100, 22)
    reqs = [make_req(f"r{i}", prompt[:n], max_tokens=6) for i, n in enumerate([14, 16, 16, 17, 20, 20, 21, 15])]
    num_shared_seen = 0
    for i in range(200):
        if i % 4 == 0 and i // 4 < len(reqs):
            sched.add(reqs[i // 4])
        if not sched.has_work:
            break
        batch = sched.schedule()
        for seq in batch.seqs:
            assert seq.num_new_tokens >= 1
            written = written_block_ids(seq, BS)
            assert all(bm.ref_counts[b] == 1 for b in written), "a write into a shared block"
            num_shared_seen += sum(bm.ref_counts[b] > 1 for b in seq.req.block_ids)
        sched.update(batch, [100 + s.num_new_tokens for s in batch.sampled_seqs])
    assert num_shared_seen > 0 and not sched.has_work
    assert sum(r.num_cached_tokens for r in reqs) > 0
    assert_all_blocks_free(sched)


def test_a_preempted_request_hits_its_own_blocks_on_readmission() -> None:
    # 6 usable blocks: a (3 blocks) and bb (2 blocks) prefill; next step a takes the last
    # free block, and bb, out of blocks, is preempted (its full blocks stay cached).
    sched = make_scheduler(num_blocks=7, block_size=BS, watermark_blocks=0)
    model = PagedFakeModel(BS, sched.block_manager)
    a = make_req("a", ids(100, 12), max_tokens=6)
    bb = make_req("bb", ids(200, 8), max_tokens=6)
    sched.add(a)
    sched.add(bb)
    step(sched, model=model)
    batch, _ = step(sched, model=model)
    assert shape(batch) == [("a", 12, 1)]
    assert bb.state is RequestState.WAITING and bb.num_preemptions == 1 and bb.num_computed_tokens == 0
    own_blocks = bm_blocks = sched.block_manager.find_cached_blocks(bb, 2)
    assert len(bm_blocks) == 2

    sched.abort("a")
    batch, _ = step(sched, model=model)
    assert shape(batch) == [("bb", 8, 1)]  # prompt + its first output: only the new token
    assert bb.block_ids[:2] == own_blocks
    assert bb.num_cached_tokens == 0  # usage reports what the first admission found
    assert sched.num_prefix_hit_tokens == 8
    run_until_done(sched, model)
    assert bb.output_ids == reference_output(bb.prompt_ids, 6)
    assert_all_blocks_free(sched)


def test_cached_free_blocks_a_hit_revives_count_against_admission() -> None:
    sched = make_scheduler(num_blocks=5, block_size=BS, watermark_blocks=0)  # 4 usable
    model = PagedFakeModel(BS, sched.block_manager)
    sched.add(make_req("a", ids(100, 8), max_tokens=1))
    run_until_done(sched, model)  # a's 2 blocks: cached, free
    c = make_req("c", ids(300, 7), max_tokens=2)
    sched.add(c)
    step(sched, model=model)  # c takes the 2 never-cached blocks
    b = make_req("b", ids(100, 16), max_tokens=1)
    sched.add(b)
    # b hits a's 2 blocks and needs 2 more: 4 of the 2 free. Counting the hit blocks as
    # already held would admit it and then run out of blocks.
    batch, _ = step(sched, model=model)
    assert shape(batch) == [("c", 7, 1)] and b.state is RequestState.WAITING
    batch, _ = step(sched, model=model)  # c finished: b gets in, still on a's blocks
    assert shape(batch) == [("b", 8, 8)]
    assert b.num_cached_tokens == 8
    run_until_done(sched, model)
    assert_all_blocks_free(sched)


def test_prefix_caching_off_shares_nothing() -> None:
    sched = make_scheduler(block_size=BS, enable_prefix_caching=False)
    model = PagedFakeModel(BS, sched.block_manager)
    reqs = [make_req(f"r{i}", ids(100, 13), max_tokens=5) for i in range(4)]
    for req in reqs:
        sched.add(req)
        step(sched, model=model)
    run_until_done(sched, model)
    assert all(r.num_cached_tokens == 0 for r in reqs)
    assert (sched.num_prefix_queries_tokens, sched.num_prefix_hit_tokens) == (0, 0)
    assert_all_blocks_free(sched)


def block_alphabet_prompt(rng, prompt_len: int) -> list[int]:
    """Prompts made of three 4-token blocks: equal blocks after different prefixes abound."""
    blocks = [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]]
    return [t for _ in range(-(-prompt_len // BS)) for t in rng.choice(blocks)][:prompt_len]


@pytest.mark.parametrize("make_prompt", [None, block_alphabet_prompt], ids=["shared-prefixes", "block-alphabet"])
@pytest.mark.parametrize(
    "hash_fn",
    [hash, lambda key: 0, lambda key: hash(key[1]), lambda key: hash(key) % 5],
    ids=["builtin", "constant", "parent-blind", "mod-5"],
)
def test_random_workload_with_colliding_hashes_keeps_every_invariant(hash_fn, make_prompt) -> None:
    # PagedFakeModel checks that every hit holds this very history: collisions cost hits only.
    reqs = run_random_workload(seed=99, make_prompt=make_prompt, hash_fn=hash_fn)
    if hash_fn is hash:
        assert sum(r.num_cached_tokens for r in reqs) > 0


# ---- the real model ----------------------------------------------------------------------------


MODEL_BS = 16
NUM_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def runner(model_dir):
    import torch


    return make_runner(model_dir, dtype=torch.float32, num_kv_blocks=64, block_size=MODEL_BS, eos_token_ids=[2])


@pytest.fixture(scope="module")
def texts(tokenizer) -> dict[str, list[int]]:
    shared = ("The lighthouse keeper kept a log of every ship that passed the rocky point, noting the "
              "weather, the hour, the colour of the hull and the flag it flew. ") * 2
    return {
        "a_b": tokenizer.encode(shared + "Which ship did he remember best, and why?").ids,
        "a_c": tokenizer.encode(shared + "Summarise the log in one line.").ids,
    }


def greedy(runner, prompts: dict[str, list[int]], *, caching: bool, arrival_steps: dict[str, int],
           max_num_batched_tokens: int = 2048) -> dict[str, EngineRequest]:
    """Runs the prompts through the real scheduler and model, each arriving at its step."""
    from rill.engine_proc.sched.scheduler import Scheduler

    sched = Scheduler(
        BlockManager(runner.kv_cache.num_blocks, MODEL_BS, enable_prefix_caching=caching),
        max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens, max_model_len=2048, eos_token_ids=[2],
    )
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, min_tokens=NUM_NEW_TOKENS)
    reqs = {name: EngineRequest(name, "w", list(ids), params) for name, ids in prompts.items()}
    for step_index in range(500):
        for name, arrival in arrival_steps.items():
            if arrival == step_index:
                sched.add(reqs[name])
        if step_index > max(arrival_steps.values()) and not sched.has_work:
            break
        batch = sched.schedule()
        if batch:
            for seq in batch.seqs:  # the real KV cache: a write into a shared block is a bug
                written = written_block_ids(seq, MODEL_BS)
                assert all(sched.block_manager.ref_counts[b] == 1 for b in written)
            sched.update(batch, runner.execute(batch))
    assert all(r.finish is FinishReason.LENGTH for r in reqs.values())
    return reqs


@pytest.mark.parametrize(("max_num_batched_tokens", "a_b_arrival"), [(2048, 8), (21, 2)])
def test_greedy_tokens_do_not_change_with_a_prefix_hit(runner, texts, max_num_batched_tokens, a_b_arrival):
    alone = greedy(runner, {"a_b": texts["a_b"]}, caching=False, arrival_steps={"a_b": 0})["a_b"]
    # a_c computes the shared blocks; a_b arrives while a_c decodes (with a budget of 21, while
    # it still prefills, so it finds the blocks of a_c's first chunks), and a second a_b after
    # both, which finds a_b's own blocks too.
    reqs = greedy(
        runner,
        {"a_c": texts["a_c"], "a_b": texts["a_b"], "a_b_again": texts["a_b"]},
        caching=True,
        arrival_steps={"a_c": 0, "a_b": a_b_arrival, "a_b_again": 40},
        max_num_batched_tokens=max_num_batched_tokens,
    )
    num_shared_blocks = next(i for i, (x, y) in enumerate(zip(texts["a_b"], texts["a_c"])) if x != y) // MODEL_BS
    assert num_shared_blocks >= 3
    assert reqs["a_c"].num_cached_tokens == 0
    num_cached_tokens = reqs["a_b"].num_cached_tokens
    assert num_cached_tokens % MODEL_BS == 0 and MODEL_BS <= num_cached_tokens <= num_shared_blocks * MODEL_BS
    if max_num_batched_tokens == 2048:
        assert num_cached_tokens == num_shared_blocks * MODEL_BS
    assert reqs["a_b_again"].num_cached_tokens == (len(texts["a_b"]) - 1) // MODEL_BS * MODEL_BS
    assert reqs["a_b"].output_ids == reqs["a_b_again"].output_ids == alone.output_ids
