"""The scheduler, driven by hand and by a tiny fake model that reads its tokens from a paged cache."""
from __future__ import annotations

import pytest

from rill.engine_proc.sched.batch import TokenDelta
from rill.engine_proc.sched.request import EngineRequest, RequestState
from rill.ipc.protocol import FinishReason
from tests.helpers.scheduling import (
    EOS,
    PagedFakeModel,
    assert_all_blocks_free,
    make_req,
    make_scheduler,
    reference_output,
    run_random_workload,
    run_until_done,
    shape,
    step,
)

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
