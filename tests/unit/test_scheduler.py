"""The scheduler, driven by hand and by a tiny fake model that reads its tokens from a paged cache."""
from __future__ import annotations

import random

import pytest

from engine_proc.sched.batch import Batch, TokenDelta
from engine_proc.sched.block_manager import NULL_BLOCK_ID, BlockManager
from engine_proc.sched.request import EngineRequest, RequestState
from engine_proc.sched.scheduler import Scheduler
from ipc.protocol import FinishReason, SamplingParams

EOS = 2


def make_req(req_id: str, prompt_len: int = 4, max_tokens: int = 16, **params) -> EngineRequest:
    prompt_ids = [10 + (i * 7 + len(req_id)) % 50 for i in range(prompt_len)]
    return EngineRequest(req_id, "w0", prompt_ids, SamplingParams(max_tokens=max_tokens, **params))


def make_scheduler(
    num_blocks: int = 65,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 1024,
    enable_prefix_caching: bool = True,
    hash_fn=hash,
    **kwargs,
) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching, hash_fn=hash_fn),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        eos_token_ids=[EOS],
        **kwargs,
    )


def fake_next(ids: list[int]) -> int:
    """The 'model': a deterministic function of the whole token history (never EOS)."""
    return (sum(ids) * 31 + len(ids)) % 97 + 3


class PagedFakeModel:
    """Writes each scheduled token into its KV slot and samples from what the slots hold.

    A slot holds its position's whole history (as real K/V depends on every earlier token):
    the history read from the slot before it, plus its own token. Reading back through the
    block table is what catches bookkeeping bugs: a block shared by two requests, a block
    table that does not cover a position, a recompute that skipped positions, or a prefix
    cache hit on a block computed after another prefix would feed the 'model' a wrong history.
    Given the block manager, it also asserts that no step writes into a shared block.
    """

    def __init__(self, block_size: int, block_manager: BlockManager | None = None) -> None:
        self.block_size = block_size
        self.block_manager = block_manager
        self.slots: dict[tuple[int, int], tuple[int, ...]] = {}

    def run(self, batch: Batch) -> list[int]:
        bs = self.block_size
        for seq in batch.seqs:
            block_ids = seq.req.block_ids
            end_pos = seq.start_pos + seq.num_new_tokens
            assert len(block_ids) * bs >= end_pos, "block table does not cover the step"
            assert NULL_BLOCK_ID not in block_ids
            pos = seq.start_pos
            history = self.slots[(block_ids[(pos - 1) // bs], (pos - 1) % bs)] if pos else ()
            assert len(history) == pos, "the slot before the step holds another position"
            for pos, token_id in enumerate(seq.token_ids, seq.start_pos):
                block_id = block_ids[pos // bs]
                if self.block_manager is not None:
                    assert self.block_manager.ref_counts[block_id] == 1, f"a write into shared block {block_id}"
                history += (token_id,)
                self.slots[(block_id, pos % bs)] = history
        sampled = []
        for seq in batch.sampled_seqs:
            block_ids = seq.req.block_ids
            end_pos = seq.start_pos + seq.num_new_tokens
            history = self.slots[(block_ids[(end_pos - 1) // bs], (end_pos - 1) % bs)]
            assert list(history) == seq.req.token_ids(0, end_pos), "the cache holds another history"
            sampled.append(fake_next(list(history)))
        return sampled


def step(sched: Scheduler, sampled: list[int] | None = None, model: PagedFakeModel | None = None):
    """One step as the busy loop runs it; ids hand-fed, from the fake model, or 100 + position."""
    batch = sched.schedule()
    deltas = []
    if batch:
        if sampled is None:
            if model is not None:
                sampled = model.run(batch)
            else:
                sampled = [100 + s.start_pos + s.num_new_tokens for s in batch.sampled_seqs]
        deltas = sched.update(batch, sampled)
    return batch, deltas + sched.take_errored()


def shape(batch: Batch) -> list[tuple[str, int, int]]:
    return [(s.req.req_id, s.start_pos, s.num_new_tokens) for s in batch.seqs]


def run_until_done(sched: Scheduler, model: PagedFakeModel, max_steps: int = 100_000):
    """Runs to the end; returns the ids each request streamed and its finish."""
    streamed: dict[str, list[int]] = {}
    finishes: dict[str, FinishReason] = {}
    for _ in range(max_steps):
        if not sched.has_work:
            break
        _, deltas = step(sched, model=model)
        collect(deltas, streamed, finishes)
    else:
        pytest.fail("scheduler did not drain")
    return streamed, finishes


def collect(deltas: list[TokenDelta], streamed: dict, finishes: dict) -> None:
    for delta in deltas:
        req_id = delta.req.req_id
        assert req_id not in finishes, "delta after the finish"
        streamed.setdefault(req_id, []).extend(delta.new_ids)
        if delta.finish is not None:
            finishes[req_id] = delta.finish


def reference_output(prompt_ids: list[int], max_tokens: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        ids.append(fake_next(ids))
    return ids[len(prompt_ids) :]


def assert_all_blocks_free(sched: Scheduler) -> None:
    bm = sched.block_manager
    assert bm.num_free_blocks() == bm.num_total_blocks()
    assert all(count == 0 for count in bm.ref_counts[1:])


# ---- admission and batching -------------------------------------------------------------


def test_fcfs_and_max_num_seqs() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for req_id in "abc":
        sched.add(make_req(req_id, prompt_len=3))
    batch, deltas = step(sched)
    assert shape(batch) == [("a", 0, 3), ("b", 0, 3)]
    assert (sched.num_running, sched.num_waiting) == (2, 1)
    assert [d.req.req_id for d in deltas] == ["a", "b"]

    batch, deltas = step(sched, sampled=[EOS, 50])  # a stops, freeing a seat
    assert shape(batch) == [("a", 3, 1), ("b", 3, 1)]
    assert deltas[0].finish is FinishReason.STOP
    batch, _ = step(sched)
    assert shape(batch) == [("b", 4, 1), ("c", 0, 3)]


def test_empty_scheduler_has_no_work() -> None:
    sched = make_scheduler()
    assert not sched.has_work
    batch = sched.schedule()
    assert not batch
    assert sched.update(batch, []) == []
    assert sched.take_errored() == []


def test_long_prompt_is_chunked_under_the_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add(make_req("long", prompt_len=20))
    shapes, num_deltas = [], []
    for _ in range(4):
        batch, deltas = step(sched)
        shapes.append(shape(batch))
        num_deltas.append(len(deltas))
    assert shapes == [[("long", 0, 8)], [("long", 8, 8)], [("long", 16, 4)], [("long", 20, 1)]]
    assert num_deltas == [0, 0, 1, 1]  # a prefill chunk that samples nothing gets no delta


def test_chunked_prefill_interleaves_with_decodes() -> None:
    sched = make_scheduler(max_num_batched_tokens=9)
    dec = make_req("dec", prompt_len=1)
    sched.add(dec)
    sched.add(make_req("long", prompt_len=20))
    expected = [
        [("dec", 0, 1), ("long", 0, 8)],
        [("dec", 1, 1), ("long", 8, 8)],
        [("dec", 2, 1), ("long", 16, 4)],
        [("dec", 3, 1), ("long", 20, 1)],
    ]
    for i, expected_shape in enumerate(expected):
        batch, deltas = step(sched)
        assert shape(batch) == expected_shape
        assert batch.num_tokens <= 9
        sampled_ids = [d.req.req_id for d in deltas]
        assert sampled_ids == (["dec", "long"] if i >= 2 else ["dec"])
        for seq in batch.seqs:  # blocks cover everything scheduled
            assert len(seq.req.block_ids) * 4 >= seq.start_pos + seq.num_new_tokens


def test_budget_shared_by_many_prompts_in_fcfs_order() -> None:
    sched = make_scheduler(max_num_batched_tokens=10)
    for req_id, prompt_len in (("a", 4), ("b", 4), ("c", 4)):
        sched.add(make_req(req_id, prompt_len=prompt_len))
    batch, _ = step(sched)
    assert shape(batch) == [("a", 0, 4), ("b", 0, 4), ("c", 0, 2)]
    batch, _ = step(sched)
    assert shape(batch) == [("a", 4, 1), ("b", 4, 1), ("c", 2, 2)]


def test_request_arriving_mid_generation_joins_the_next_step() -> None:
    sched = make_scheduler()
    sched.add(make_req("a", prompt_len=5))
    step(sched)
    step(sched)
    sched.add(make_req("b", prompt_len=3))
    batch, deltas = step(sched)
    assert shape(batch) == [("a", 6, 1), ("b", 0, 3)]
    assert [d.req.req_id for d in deltas] == ["a", "b"]


# ---- finishing ----------------------------------------------------------------------------


def run_hand_fed(req: EngineRequest, token_ids: list[int], **sched_kwargs) -> list[TokenDelta]:
    sched = make_scheduler(**sched_kwargs)
    sched.add(req)
    all_deltas = []
    for token_id in token_ids:
        _, deltas = step(sched, sampled=[token_id])
        all_deltas += deltas
        if req.finish is not None:
            break
    if req.finish is not None:
        assert_all_blocks_free(sched)
    return all_deltas


def test_eos_stops() -> None:
    req = make_req("a")
    deltas = run_hand_fed(req, [7, 8, EOS, 9])
    assert req.output_ids == [7, 8, EOS]
    assert [d.new_ids for d in deltas] == [[7], [8], [EOS]]
    assert [d.finish for d in deltas] == [None, None, FinishReason.STOP]
    assert req.state is RequestState.FINISHED and req.finish is FinishReason.STOP


def test_eos_before_min_tokens_does_not_stop() -> None:
    req = make_req("a", min_tokens=3)
    run_hand_fed(req, [EOS, EOS, EOS, 5])
    assert req.output_ids == [EOS, EOS, EOS]  # the third reaches min_tokens
    assert req.finish is FinishReason.STOP


def test_ignore_eos() -> None:
    req = make_req("a", max_tokens=4, ignore_eos=True)
    run_hand_fed(req, [EOS, EOS, EOS, EOS, EOS])
    assert req.output_ids == [EOS] * 4
    assert req.finish is FinishReason.LENGTH


def test_stop_token_ids_stop_even_with_ignore_eos_but_not_before_min_tokens() -> None:
    req = make_req("a", stop_token_ids=[42], ignore_eos=True, min_tokens=2)
    run_hand_fed(req, [42, EOS, 42, 7])
    assert req.output_ids == [42, EOS, 42]
    assert req.finish is FinishReason.STOP


def test_max_tokens_gives_length() -> None:
    req = make_req("a", max_tokens=3)
    deltas = run_hand_fed(req, [5, 6, 7, 8])
    assert req.output_ids == [5, 6, 7]
    assert deltas[-1].finish is FinishReason.LENGTH


def test_max_model_len_gives_length() -> None:
    req = make_req("a", prompt_len=5, max_tokens=100)
    run_hand_fed(req, [5, 6, 7, 8, 9], max_model_len=8)
    assert req.output_ids == [5, 6, 7]  # 5 + 3 == max_model_len
    assert req.finish is FinishReason.LENGTH


def test_stop_wins_over_length_on_the_same_token() -> None:
    req = make_req("a", max_tokens=2)
    run_hand_fed(req, [5, EOS])
    assert req.finish is FinishReason.STOP


# ---- abort --------------------------------------------------------------------------------


def test_abort_waiting_and_running_frees_blocks() -> None:
    sched = make_scheduler(max_num_seqs=1)
    running, waiting = make_req("run", prompt_len=9), make_req("wait")
    sched.add(running)
    sched.add(waiting)
    step(sched)
    assert running.block_ids and sched.num_waiting == 1

    assert sched.abort("wait") is waiting
    assert waiting.finish is FinishReason.ABORT and waiting.state is RequestState.FINISHED
    assert sched.num_waiting == 0
    assert sched.abort("run") is running
    assert running.finish is FinishReason.ABORT and running.block_ids == []
    assert sched.num_running == 0 and not sched.has_work
    assert_all_blocks_free(sched)
    assert sched.abort("run") is None
    assert sched.abort("never-seen") is None


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched = make_scheduler()
    a, b = make_req("a"), make_req("b")
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    sched.abort("a")
    deltas = sched.update(batch, [11, 12])
    assert [(d.req.req_id, d.new_ids) for d in deltas] == [("b", [12])]
    assert a.output_ids == []
    batch, _ = step(sched)
    assert shape(batch) == [("b", 4, 1)]


# ---- preemption ---------------------------------------------------------------------------


def test_preempts_the_most_recently_admitted_and_requeues_it_at_the_front() -> None:
    # 4 usable blocks of 4 tokens; watermark 0 so both prompts get in. No prefix caching: a
    # and b have the same prompt, and b would restart from a's blocks (test_prefix_cache.py).
    sched = make_scheduler(num_blocks=5, block_size=4, watermark_blocks=0, enable_prefix_caching=False)
    a, b, c = make_req("a", prompt_len=8), make_req("b", prompt_len=8), make_req("c", prompt_len=2)
    sched.add(a)
    sched.add(b)
    batch, _ = step(sched)
    assert shape(batch) == [("a", 0, 8), ("b", 0, 8)]
    sched.add(c)  # queued behind b's readmission
    b_output = list(b.output_ids)

    batch, deltas = step(sched)  # a crosses into a 3rd block: none free, b goes
    assert shape(batch) == [("a", 8, 1)]
    assert b.state is RequestState.WAITING and b.num_computed_tokens == 0
    assert b.block_ids == [] and b.num_preemptions == 1 and b.output_ids == b_output
    assert (sched.num_running, sched.num_waiting) == (1, 2)
    assert [d.req.req_id for d in deltas] == ["a"]

    sched.abort("a")
    batch, deltas = step(sched)
    assert shape(batch)[0] == ("b", 0, 9)  # recomputes prompt + its one output, ahead of c
    assert [d.req.req_id for d in deltas][0] == "b"
    assert b.output_ids[:1] == b_output and len(b.output_ids) == 2


def test_no_admission_in_a_step_that_preempted() -> None:
    sched = make_scheduler(num_blocks=5, block_size=4, watermark_blocks=0)
    sched.add(make_req("a", prompt_len=8))
    sched.add(make_req("b", prompt_len=7))
    step(sched)
    sched.add(make_req("tiny", prompt_len=1))
    batch, _ = step(sched)  # a preempts b, which frees 2 blocks: still nobody admitted
    assert shape(batch) == [("a", 8, 1)]
    assert sched.num_waiting == 2


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs"),
    [(7, 4, 64, 8), (14, 2, 5, 4), (13, 4, 16, 3), (6, 8, 7, 8)],
)
def test_preemption_loses_and_repeats_no_token(
    num_blocks: int, block_size: int, max_num_batched_tokens: int, max_num_seqs: int
) -> None:
    # The longest request (11 + 14 tokens) fits alone in each cache, but not all of them at once.
    prompts = {f"r{i}": 3 + (i * 5) % 9 for i in range(6)}

    def run(num_blocks: int):
        sched = make_scheduler(
            num_blocks=num_blocks,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        reqs = [make_req(rid, prompt_len=n, max_tokens=14, ignore_eos=True) for rid, n in prompts.items()]
        for req in reqs:
            sched.add(req)
        streamed, finishes = run_until_done(sched, PagedFakeModel(block_size, sched.block_manager))
        assert_all_blocks_free(sched)
        return reqs, streamed, finishes

    tight_reqs, tight_streamed, tight_finishes = run(num_blocks)
    roomy_reqs, _, _ = run(num_blocks=1000)
    assert sum(r.num_preemptions for r in tight_reqs) > 0, "the tight cache must preempt"
    assert sum(r.num_preemptions for r in roomy_reqs) == 0
    for tight, roomy in zip(tight_reqs, roomy_reqs):
        assert tight.output_ids == roomy.output_ids == reference_output(tight.prompt_ids, 14)
        assert tight_streamed[tight.req_id] == tight.output_ids  # each token streamed once
        assert tight_finishes[tight.req_id] is FinishReason.LENGTH


def run_random_workload(seed: int = 1234, make_prompt=None, **sched_kwargs) -> list[EngineRequest]:
    """40 requests arriving, aborted, preempted at random; every invariant checked each step.

    make_prompt(rng, prompt_len) -> prompt ids; by default make_req's.
    """
    rng = random.Random(seed)
    block_size = 4
    sched = make_scheduler(num_blocks=17, block_size=block_size, max_num_seqs=5, max_num_batched_tokens=12,
                           **sched_kwargs)
    bm = sched.block_manager
    model = PagedFakeModel(block_size, bm)
    # Request ids of the same length get the same prompt ids (make_req): prompts share prefixes.
    pending = [
        make_req(f"r{i}", prompt_len=rng.randint(1, 30), max_tokens=rng.randint(1, 20), ignore_eos=True)
        for i in range(40)
    ]
    if make_prompt is not None:
        for req in pending:
            req.prompt_ids = make_prompt(rng, req.num_prompt_tokens)
    reqs = list(pending)
    aborted: set[str] = set()
    streamed: dict[str, list[int]] = {}
    finishes: dict[str, FinishReason] = {}
    for _ in range(5000):
        if not pending and not sched.has_work:
            break
        for _ in range(rng.randint(0, 2)):
            if pending:
                sched.add(pending.pop(0))
        if rng.random() < 0.03 and reqs:
            victim = rng.choice(reqs)
            if sched.abort(victim.req_id) is not None:
                aborted.add(victim.req_id)
        batch = sched.schedule()
        assert batch.num_tokens <= 12
        assert sched.num_running <= 5
        holders: dict[int, int] = {}
        for req in reqs:
            assert req.state is RequestState.RUNNING or not req.block_ids, "only running requests hold blocks"
            for block_id in req.block_ids:
                holders[block_id] = holders.get(block_id, 0) + 1
        assert all(bm.ref_counts[b] == n for b, n in holders.items()), "ref counts != holders"
        assert len(holders) + bm.num_free_blocks() == bm.num_total_blocks()
        if not bm.enable_prefix_caching:
            assert max(holders.values(), default=1) == 1, "a block shared with prefix caching off"
        collect(sched.update(batch, model.run(batch)), streamed, finishes)
    else:
        pytest.fail("did not drain")
    assert_all_blocks_free(sched)
    assert sum(req.num_preemptions for req in reqs) > 0, "the workload must exercise preemption"
    for req in reqs:
        if req.req_id in aborted:
            assert req.finish is FinishReason.ABORT
            continue
        assert req.finish is FinishReason.LENGTH
        assert req.output_ids == reference_output(req.prompt_ids, req.params.max_tokens)
        assert streamed[req.req_id] == req.output_ids
    return reqs


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_random_workload_keeps_every_invariant(enable_prefix_caching: bool) -> None:
    reqs = run_random_workload(enable_prefix_caching=enable_prefix_caching)
    num_cached_tokens = sum(req.num_cached_tokens for req in reqs)
    assert (num_cached_tokens > 0) == enable_prefix_caching


# ---- requests the cache cannot hold -------------------------------------------------------


def test_prompt_bigger_than_the_whole_cache_errors_without_blocking_others() -> None:
    sched = make_scheduler(num_blocks=5, block_size=4)  # 16 tokens in all
    big = make_req("big", prompt_len=17)
    small = make_req("small", prompt_len=3, max_tokens=3)
    sched.add(big)
    sched.add(small)
    assert big.state is RequestState.FINISHED and big.finish is FinishReason.ERROR
    assert sched.num_waiting == 1
    model = PagedFakeModel(4)
    batch, deltas = step(sched, model=model)
    assert shape(batch) == [("small", 0, 3)]
    assert [d.req.req_id for d in deltas] == ["small", "big"]
    assert (deltas[1].new_ids, deltas[1].finish) == ([], FinishReason.ERROR)
    streamed, finishes = run_until_done(sched, model)
    assert small.finish is FinishReason.LENGTH and len(small.output_ids) == 3
    assert "big" not in finishes  # reported exactly once
    assert_all_blocks_free(sched)


def test_error_is_reported_even_when_nothing_else_runs() -> None:
    sched = make_scheduler(num_blocks=3, block_size=4, max_model_len=64)
    sched.add(make_req("big", prompt_len=9))
    assert sched.has_work  # so that the busy loop does not sleep on it
    assert not sched.schedule()
    deltas = sched.take_errored()
    assert [(d.req.req_id, d.new_ids, d.finish) for d in deltas] == [("big", [], FinishReason.ERROR)]
    assert not sched.has_work
    assert sched.take_errored() == []


def test_prompt_longer_than_max_model_len_errors() -> None:
    sched = make_scheduler(max_model_len=8)
    req = make_req("a", prompt_len=9)
    sched.add(req)
    _, deltas = step(sched)
    assert req.finish is FinishReason.ERROR and deltas[0].req is req


def test_prompt_the_size_of_the_cache_runs() -> None:
    sched = make_scheduler(num_blocks=5, block_size=4, max_model_len=64)
    req = make_req("a", prompt_len=16, max_tokens=5, ignore_eos=True)
    sched.add(req)
    _, deltas = step(sched)
    # One token sampled; computing its position would need a 5th block.
    assert req.output_ids and deltas[-1].finish is FinishReason.ERROR
    assert deltas[-1].new_ids == req.output_ids
    assert_all_blocks_free(sched)


def test_generation_outgrowing_the_cache_errors_with_its_tokens_streamed() -> None:
    sched = make_scheduler(num_blocks=3, block_size=4, max_model_len=100)  # 8 tokens in all
    req = make_req("a", prompt_len=3, max_tokens=100, ignore_eos=True)
    sched.add(req)
    streamed, finishes = run_until_done(sched, PagedFakeModel(4))
    assert finishes == {"a": FinishReason.ERROR}
    assert len(req.output_ids) == 6  # 3 + 6 = 9 tokens: the 9th position would need block 3
    assert streamed["a"] == req.output_ids == reference_output(req.prompt_ids, 6)
    assert_all_blocks_free(sched)


# ---- watermark ----------------------------------------------------------------------------


def test_watermark_keeps_newcomers_from_starving_running_requests() -> None:
    sched = make_scheduler(num_blocks=11, block_size=4, watermark_blocks=2)  # 10 usable
    sched.add(make_req("a", prompt_len=16))  # 4 blocks
    sched.add(make_req("b", prompt_len=16))  # 4 blocks: leaves 2 == watermark
    sched.add(make_req("c", prompt_len=4))  # 1 block would leave 1 < watermark
    batch, _ = step(sched)
    assert shape(batch) == [("a", 0, 16), ("b", 0, 16)]
    assert sched.num_waiting == 1
    batch, _ = step(sched)  # a and b each take a 5th block: free 0
    assert [s.req.req_id for s in batch.seqs] == ["a", "b"]
    assert sched.num_running == 2 and sched.block_manager.num_free_blocks() == 0


def test_watermark_does_not_apply_when_nothing_runs() -> None:
    sched = make_scheduler(num_blocks=11, block_size=4, watermark_blocks=2)
    sched.add(make_req("whole", prompt_len=40, max_tokens=1))  # every block
    batch, _ = step(sched)
    assert shape(batch) == [("whole", 0, 40)]
    assert sched.block_manager.num_free_blocks() == 0 or not sched.has_work


def test_default_watermark_is_one_percent_and_at_least_one_block() -> None:
    assert make_scheduler(num_blocks=65).watermark_blocks == 1
    assert make_scheduler(num_blocks=1001).watermark_blocks == 10
