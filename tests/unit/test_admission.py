"""Admission control's counters and --request-timeout's deadlines, fed by hand; then the input
thread's verdicts and the busy loop's reports over a real scheduler, without a model."""
from __future__ import annotations

import queue

from rill.engine_proc.core import EngineCore
from rill.engine_proc.io_threads import InputThread
from rill.engine_proc.sched.admission import MAX_RETRY_AFTER_S, AdmissionControl
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.deadlines import Deadlines
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc import protocol as p

ADMITTED, QUEUE_FULL, TOKENS_FULL = p.Verdict.ADMITTED, p.Verdict.QUEUE_FULL, p.Verdict.QUEUE_TOKENS_FULL


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_bound_admits_everything():
    ac = AdmissionControl()
    assert not ac.enabled
    assert all(ac.admit(1, 10_000) is ADMITTED for _ in range(1000))
    assert ac.num_rejected == 0


def test_admitted_requests_count_until_the_loop_has_them():
    ac = AdmissionControl(max_queued_requests=2, max_num_seqs=1)
    ac.update(0, 0, num_waiting=0, num_waiting_tokens=0, num_free_seats=0)  # one running, no seat free
    assert ac.admit(1, 5) is ADMITTED
    assert ac.admit(1, 5) is ADMITTED
    assert ac.admit(1, 5) is QUEUE_FULL  # the loop has not seen the two yet: they still count
    ac.update(2, 10, num_waiting=2, num_waiting_tokens=10, num_free_seats=0)  # now it waits there
    assert ac.num_queued == 2
    assert ac.admit(1, 5) is QUEUE_FULL
    ac.update(0, 0, num_waiting=1, num_waiting_tokens=5, num_free_seats=0)  # one left the queue
    assert ac.admit(1, 5) is ADMITTED
    assert ac.admit(1, 5) is QUEUE_FULL
    assert ac.num_rejected == 3


def test_free_seats_take_newcomers_only_while_nothing_waits():
    ac = AdmissionControl(max_queued_requests=1, max_num_seqs=4)
    ac.update(0, 0, num_waiting=0, num_waiting_tokens=0, num_free_seats=3)
    assert [ac.admit(1, 1) for _ in range(5)] == [ADMITTED] * 4 + [QUEUE_FULL]  # 3 seats + 1 queued
    # Requests left waiting beside free seats are held back by blocks: the seats do not count.
    ac.update(4, 4, num_waiting=1, num_waiting_tokens=1, num_free_seats=0)
    assert ac.admit(1, 1) is QUEUE_FULL


def test_a_prompt_list_is_admitted_or_refused_whole():
    ac = AdmissionControl(max_queued_requests=3)
    ac.update(0, 0, num_waiting=2, num_waiting_tokens=20, num_free_seats=0)
    assert ac.admit(2, 20) is QUEUE_FULL  # 2 + 2 > 3, though one of the two would fit
    assert ac.num_rejected == 2
    assert ac.admit(1, 10) is ADMITTED


def test_token_bound():
    ac = AdmissionControl(max_queued_tokens=100)
    assert ac.admit(1, 60) is ADMITTED
    assert ac.admit(1, 41) is TOKENS_FULL
    assert ac.admit(1, 40) is ADMITTED  # exactly at the bound
    ac.update(2, 100, num_waiting=1, num_waiting_tokens=40, num_free_seats=0)  # the 60 started
    assert ac.admit(1, 61) is TOKENS_FULL
    assert ac.admit(1, 60) is ADMITTED


def test_a_submit_larger_than_a_bound_on_its_own_is_refused_even_when_nothing_waits():
    """Its real size counts with an empty queue: prompts x n past every seat and the whole queue, or
    tokens past the token bound, could never be admitted, so they get TOO_MANY_* (a 400), not in."""
    TOO_MANY_REQUESTS, TOO_MANY_TOKENS = p.Verdict.TOO_MANY_REQUESTS, p.Verdict.TOO_MANY_TOKENS
    ac = AdmissionControl(max_queued_requests=2, max_queued_tokens=100, max_num_seqs=4)
    assert ac.num_queued == 0
    assert ac.admit(7, 7) is TOO_MANY_REQUESTS and ac.limit_of(TOO_MANY_REQUESTS) == 6  # 4 seats + 2 queued
    assert ac.admit(1, 101) is TOO_MANY_TOKENS and ac.limit_of(TOO_MANY_TOKENS) == 100
    assert ac.num_rejected == 8 and ac.num_queued == 0
    assert ac.admit(6, 100) is ADMITTED  # exactly at both bounds, with every seat free
    ac.update(6, 100, num_waiting=2, num_waiting_tokens=20, num_free_seats=0)
    assert ac.admit(1, 1) is QUEUE_FULL  # a retry later may get in: a 429
    # With the seats taken and nothing waiting, the queue's bound alone counts.
    ac.update(0, 0, num_waiting=0, num_waiting_tokens=0, num_free_seats=0)
    assert ac.admit(3, 3) is QUEUE_FULL and ac.admit(2, 2) is ADMITTED
    assert ac.limit_of(ADMITTED) == ac.limit_of(QUEUE_FULL) == 0


def test_retry_after_follows_the_time_between_departures():
    clock = Clock()
    ac = AdmissionControl(max_queued_requests=1, clock=clock)
    assert ac.retry_after_s() == 1  # nothing measured yet
    ac.update(0, 0, num_waiting=3, num_waiting_tokens=3, num_free_seats=0)
    clock.now += 2.5
    ac.update(0, 0, num_waiting=3, num_waiting_tokens=3, num_free_seats=0)  # nobody left yet
    clock.now += 2.5
    ac.update(0, 0, num_waiting=2, num_waiting_tokens=2, num_free_seats=0)  # one left after 5 s
    assert ac.retry_after_s() == 5
    clock.now += 2.0
    ac.update(0, 0, num_waiting=0, num_waiting_tokens=0, num_free_seats=2)  # two more in 2 s: 1 s each
    assert ac.retry_after_s() == 4  # smoothed: 5 + (1 - 5) / 4
    clock.now += 1000  # an idle queue times nothing
    ac.update(0, 0, num_waiting=1, num_waiting_tokens=1, num_free_seats=0)
    clock.now += 1000
    ac.update(0, 0, num_waiting=0, num_waiting_tokens=0, num_free_seats=1)
    assert ac.retry_after_s() == MAX_RETRY_AFTER_S  # and a stuck queue is capped


def test_deadlines_come_out_in_arrival_order_and_only_live_ones():
    d = Deadlines(timeout_s=10)
    for i in range(4):
        d.add(f"r{i}", arrival_s=float(i))
    d.discard("r1")  # finished in time
    assert d.expired(9.5) == []
    assert d.expired(12.0) == ["r0", "r2"]
    assert d.expired(12.0) == []
    assert len(d) == 1
    off = Deadlines(0)
    off.add("r", 0.0)
    assert len(off) == 0 and off.expired(1e9) == []


# ---- the input thread and the busy loop around a real scheduler (no model, no sockets) -------


class NoRunner:
    kv_cache = type("KVCache", (), {"num_bytes": 0})
    vocab_size, lora = 1 << 16, None  # the Runner protocol's (engine_proc/model/runner_api.py)

    def execute(self, batch):
        raise AssertionError("no step in these tests")


def engine(max_num_seqs: int, admission: AdmissionControl, timeout_s: float = 0.0, clock=None):
    scheduler = Scheduler(BlockManager(64, 4, enable_prefix_caching=False), max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=64, max_model_len=64, eos_token_ids=[0])
    inputs: queue.SimpleQueue = queue.SimpleQueue()
    published: list = []
    thread = InputThread.__new__(InputThread)  # its socket is not needed to judge a Submit
    thread.inputs, thread.admission, thread.publish = inputs, admission, published.append
    core = EngineCore(scheduler, NoRunner(), inputs, published.append, admission=admission,
                      deadlines=Deadlines(timeout_s), **({"clock": clock} if clock else {}))
    return thread, core, published


def submit(thread: InputThread, *names: str, prompt_len: int = 4) -> None:
    params = p.SamplingParams(max_tokens=4)
    thread.submit(p.Submit(list(names), "w1", params, [[1] * prompt_len for _ in names]))


def test_input_thread_answers_each_submit_and_the_loop_keeps_counts_current():
    ac = AdmissionControl(max_queued_requests=2, max_num_seqs=1)
    thread, core, published = engine(1, ac)
    submit(thread, "a")
    core.drain_inputs(block=False)
    core.scheduler.schedule()  # "a" runs: the one seat is taken
    core.report_queue()
    submit(thread, "b")
    submit(thread, "c")
    submit(thread, "d", "e")  # a prompt list of two: no room for both
    submit(thread, "f")
    verdicts = [(m.req_id, m.verdict) for _, m in published]
    assert verdicts == [("a", ADMITTED), ("b", ADMITTED), ("c", ADMITTED), ("d", QUEUE_FULL), ("f", QUEUE_FULL)]
    assert all(worker == "w1" for worker, _ in published)
    assert published[-1][1].retry_after_s >= 1
    core.drain_inputs(block=False)
    assert core.scheduler.live_req_ids() == ["a", "b", "c"]  # refused requests never reach the loop
    core.handle(p.Abort(["b"]))  # a waiting request leaves: room for one more
    core.scheduler.schedule()
    core.report_queue()
    submit(thread, "g")
    assert published[-1][1].verdict is ADMITTED
    assert core.stats().num_rejected == 3


def test_without_a_bound_no_answer_is_sent():
    thread, core, published = engine(1, AdmissionControl())
    submit(thread, "a", "b")
    core.drain_inputs(block=False)
    assert published == [] and core.scheduler.num_waiting == 2


def test_waiting_tokens_follow_the_scheduler():
    ac = AdmissionControl(max_queued_tokens=10, max_num_seqs=1)
    thread, core, published = engine(1, ac)
    for name in ("a", "b"):  # "a" runs, then "b" waits for the one seat
        submit(thread, name, prompt_len=8)
        core.drain_inputs(block=False)
        core.scheduler.schedule()
        core.report_queue()
    assert core.scheduler.num_waiting_tokens == 8 and core.stats().num_waiting_tokens == 8
    submit(thread, "c", prompt_len=3)
    submit(thread, "d", prompt_len=2)
    assert [m.verdict for _, m in published] == [ADMITTED, ADMITTED, TOKENS_FULL, ADMITTED]


def test_overdue_requests_end_with_timeout_and_free_their_blocks():
    clock = Clock()
    thread, core, published = engine(1, AdmissionControl(), timeout_s=5.0, clock=clock)
    blocks = core.scheduler.block_manager
    free_at_start = blocks.num_free_blocks()
    for name, arrival in (("old", 90.0), ("new", 99.0)):
        core.handle(EngineRequest(name, "w1", [1] * 6, p.SamplingParams(max_tokens=4), arrival_s=arrival))
    core.scheduler.schedule()  # "old" running with blocks, "new" waiting
    assert blocks.num_free_blocks() < free_at_start
    core.publish_deltas(core.end_overdue())
    (delta_row,) = published[-1]
    assert delta_row[0] == "w1" and delta_row[1].req_id == "old" and delta_row[1].finish is p.FinishReason.TIMEOUT
    assert blocks.num_free_blocks() == free_at_start
    assert core.scheduler.live_req_ids() == ["new"]
    clock.now = 103.5
    assert core.end_overdue() == []
    clock.now = 104.0
    (late,) = core.end_overdue()
    stats = core.stats()
    assert late.req.req_id == "new" and stats.num_timed_out == 2 and stats.num_finished == 0
    assert stats.num_running == stats.num_waiting == 0 and stats.num_free_blocks == free_at_start


def test_an_abort_with_notify_tells_the_owner_cancelled_and_a_plain_one_does_not():
    """A cancel from another API worker (the Responses API) reaches the request's own worker as a
    CANCELLED delta; the owner's own abort sends nothing back."""
    thread, core, published = engine(2, AdmissionControl())
    blocks = core.scheduler.block_manager
    free_at_start = blocks.num_free_blocks()
    for name in ("mine", "theirs"):
        core.handle(EngineRequest(name, "w1", [1] * 6, p.SamplingParams(max_tokens=4), arrival_s=1.0))
    core.scheduler.schedule()
    core.handle(p.Abort(["mine"]))
    assert published == []
    core.handle(p.Abort(["theirs", "unknown"], notify=True))
    (delta_row,) = published[-1]
    assert delta_row[0] == "w1" and delta_row[1].req_id == "theirs" and delta_row[1].finish is p.FinishReason.CANCELLED
    stats = core.stats()
    assert stats.num_finished == 0 and stats.num_running == stats.num_waiting == 0
    assert blocks.num_free_blocks() == free_at_start
