"""--scheduling-policy priority in the scheduler: the queue by priority then arrival, worse running work preempted
for better waiting work (and recomputed to the same output), aging, and FCFS untouched; the paged fake model reads
every history back through the block tables, so a preemption that lost or mixed up KV would show."""
from __future__ import annotations

from rill.engine_proc.sched.priority import (
    MAX_PREEMPTIONS_PER_STEP,
    MAX_PRIORITY_LABELS,
    PriorityOrder,
    priority_figures,
)
from rill.ipc.protocol import FinishReason
from tests.helpers.scheduling import assert_all_blocks_free, make_req, make_scheduler, reference_output
from tests.helpers.spec_fakes import FakeVerifier, run


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admitted_order(batches) -> list[str]:
    seen: list[str] = []
    for step in batches:
        for req_id, *_ in step:
            if req_id not in seen:
                seen.append(req_id)
    return seen


def test_the_queue_goes_by_priority_then_arrival():
    sched = make_scheduler(max_num_seqs=1, priority=PriorityOrder(aging_s=0))
    for req_id, priority in [("late-bulk", 5), ("urgent", -1), ("normal-a", 0), ("normal-b", 0)]:
        sched.add(make_req(req_id, max_tokens=3, priority=priority))
    streamed, finishes, batches = run(sched, FakeVerifier(4, sched.block_manager))
    assert admitted_order(batches) == ["urgent", "normal-a", "normal-b", "late-bulk"]
    assert set(finishes.values()) == {FinishReason.LENGTH}
    assert_all_blocks_free(sched)


def test_fcfs_keeps_arrival_order_whatever_the_priority():
    sched = make_scheduler(max_num_seqs=1)
    for req_id, priority in [("a", 5), ("b", -1)]:
        sched.add(make_req(req_id, max_tokens=3, priority=priority))
    _, _, batches = run(sched, FakeVerifier(4, sched.block_manager))
    assert admitted_order(batches) == ["a", "b"]


def test_better_waiting_work_preempts_worse_running_work_which_comes_back_the_same():
    sched = make_scheduler(max_num_seqs=2, priority=PriorityOrder(aging_s=0))
    model = FakeVerifier(4, sched.block_manager)
    bulk = [make_req(f"bulk{i}", prompt_len=6, max_tokens=12, priority=10) for i in range(2)]
    for req in bulk:
        sched.add(req)
    for _ in range(3):  # both bulk requests running, a few tokens in
        sched.update(batch := sched.schedule(), model.run(batch))
    urgent = make_req("urgent", prompt_len=5, max_tokens=4, priority=0)
    sched.add(urgent)
    batch = sched.schedule()
    assert [s.req.req_id for s in batch.seqs] == ["bulk0", "urgent"]  # the most recent of the worst gave way
    assert sched.num_preemptions == 1 and bulk[1].num_preemptions == 1
    sched.update(batch, model.run(batch))
    streamed, finishes, _ = run(sched, model)
    assert urgent.output_ids == reference_output(urgent.prompt_ids, 4)
    for req in bulk:  # the preempted one recomputed its KV and went on to the same output
        assert req.output_ids == reference_output(req.prompt_ids, 12)
    assert finishes == {"bulk0": FinishReason.LENGTH, "bulk1": FinishReason.LENGTH, "urgent": FinishReason.LENGTH}
    assert_all_blocks_free(sched)


def test_equal_priority_never_preempts_and_a_step_preempts_a_bounded_number():
    sched = make_scheduler(max_num_seqs=8, priority=PriorityOrder(aging_s=0))
    model = FakeVerifier(4, sched.block_manager)
    for i in range(8):
        sched.add(make_req(f"r{i}", max_tokens=20, priority=3))
    sched.update(batch := sched.schedule(), model.run(batch))
    sched.add(make_req("same", max_tokens=2, priority=3))
    sched.update(batch := sched.schedule(), model.run(batch))
    assert sched.num_preemptions == 0 and "same" not in [s.req.req_id for s in batch.seqs]
    sched.add(make_req("better", max_tokens=2, priority=0))
    sched.schedule()
    assert sched.num_preemptions == 1  # one seat was enough
    assert MAX_PREEMPTIONS_PER_STEP >= 1


def test_a_big_urgent_prompt_takes_the_blocks_of_worse_requests():
    sched = make_scheduler(num_blocks=13, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                           priority=PriorityOrder(aging_s=0))
    model = FakeVerifier(4, sched.block_manager)
    for i in range(4):
        sched.add(make_req(f"bulk{i}", prompt_len=8, max_tokens=8, priority=1))
    sched.update(batch := sched.schedule(), model.run(batch))
    urgent = make_req("urgent", prompt_len=30, max_tokens=2, priority=0)  # 8 blocks: more than are free
    sched.add(urgent)
    batch = sched.schedule()
    assert "urgent" in [s.req.req_id for s in batch.seqs] and sched.num_preemptions >= 2
    sched.update(batch, model.run(batch))
    run(sched, model)
    assert urgent.output_ids == reference_output(urgent.prompt_ids, 2)
    assert_all_blocks_free(sched)


def test_aging_lets_old_bulk_work_go_before_new_urgent_work():
    clock = Clock()
    order = PriorityOrder(aging_s=10, clock=clock)
    sched = make_scheduler(max_num_seqs=1, priority=order)
    model = FakeVerifier(4, sched.block_manager)
    blocker = make_req("blocker", max_tokens=30, priority=-50)
    blocker.arrival_s = clock.now
    sched.add(blocker)
    sched.update(batch := sched.schedule(), model.run(batch))
    old = make_req("old-bulk", max_tokens=2, priority=3)
    old.arrival_s = clock.now
    sched.add(old)
    clock.now += 35  # three agings: its effective priority is 0
    fresh = make_req("fresh", max_tokens=2, priority=0)
    fresh.arrival_s = clock.now
    sched.add(fresh)
    order.start_step()
    assert order.effective(old) == 0 and order.first(sched.live_requests()[1:]) is old  # a tie: the older first
    _, _, batches = run(sched, model)
    assert admitted_order(batches)[:2] == ["blocker", "old-bulk"]


def test_priority_figures_count_what_was_asked_with_bounded_labels():
    running = [make_req(f"r{i}", priority=p) for i, p in enumerate([0, 0, 5])]
    waiting = [make_req(f"w{i}", priority=p) for i, p in enumerate([-2, 0])]
    assert priority_figures(running, waiting) == {"-2": [0, 1], "0": [2, 1], "5": [1, 0]}
    many = [make_req(f"m{i}", priority=i) for i in range(40)]
    figures = priority_figures(many, [])
    assert len(figures) == MAX_PRIORITY_LABELS and figures["other"] == [40 - (MAX_PRIORITY_LABELS - 1), 0]
