"""The scheduler with structured requests (a fake grammar, no xgrammar): waiting for a grammar, ending by it."""
from __future__ import annotations

from rill.engine_proc.sched.request import RequestState
from rill.ipc.protocol import FinishReason
from tests.helpers.scheduling import EOS, PagedFakeModel, assert_all_blocks_free, make_req, make_scheduler, step


class FakeGrammar:
    """Complete after `length` tokens, as a RequestGrammar whose matcher accepted a stop token."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.accepted: list[int] = []
        self.finish = None

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)
        if len(self.accepted) >= self.length:
            self.finish = FinishReason.STOP


def waiting_for_grammar(req_id: str, **kw):
    req = make_req(req_id, **kw)
    req.state = RequestState.WAITING_FOR_GRAMMAR
    return req


def test_a_request_waiting_for_its_grammar_is_passed_over_and_is_no_work():
    sched = make_scheduler()
    a = waiting_for_grammar("a")
    sched.add(a)
    assert not sched.has_work and sched.num_waiting == 1  # the busy loop may sleep
    assert not sched.schedule()
    sched.add(make_req("b"))
    assert sched.has_work
    batch, _ = step(sched)
    assert [s.req.req_id for s in batch.seqs] == ["b"]
    a.grammar = FakeGrammar(3)
    sched.grammar_ready(a)
    assert sched.has_work and a.state is RequestState.WAITING
    batch, _ = step(sched)
    assert [s.req.req_id for s in batch.seqs] == ["b", "a"]


def test_fcfs_holds_among_ready_requests():
    sched = make_scheduler(max_num_seqs=2)
    sched.add(waiting_for_grammar("a"))
    for name in "bcd":
        sched.add(make_req(name))
    batch, _ = step(sched)
    assert [s.req.req_id for s in batch.seqs] == ["b", "c"]  # d waits for a seat, a for its grammar


def test_aborting_a_request_waiting_for_its_grammar():
    sched = make_scheduler()
    sched.add(waiting_for_grammar("a"))
    sched.add(waiting_for_grammar("b"))
    assert sched.abort("a").finish is FinishReason.ABORT
    assert sched.num_waiting == 1 and not sched.has_work
    sched.grammar_ready(sched._waiting["b"])
    assert sched.has_work and sched.live_req_ids() == ["b"]
    sched.abort("b")
    assert not sched.has_work and sched.num_waiting == 0 and sched.num_waiting_tokens == 0


def test_a_complete_grammar_ends_the_request_despite_min_tokens_and_ignore_eos():
    sched = make_scheduler()
    req = make_req("a", max_tokens=50, min_tokens=40, ignore_eos=True)
    req.grammar = FakeGrammar(3)
    sched.add(req)
    finishes = []
    for token_id in (7, 8, EOS, 9):
        batch = sched.schedule()
        req.grammar.accept(token_id)  # the sampler's part: after sampling, before update()
        finishes += [d.finish for d in sched.update(batch, [token_id])]
        if req.finish is not None:
            break
    assert req.output_ids == [7, 8, EOS]
    assert finishes == [None, None, FinishReason.STOP] and req.finish is FinishReason.STOP
    assert_all_blocks_free(sched)


def test_preemption_keeps_the_grammar_state():
    """A preempted request recomputes prompt + output and samples only past them: its grammar
    (which accepted exactly its output) is never fed a token twice nor skips one."""
    sched = make_scheduler(num_blocks=9, block_size=4, max_num_batched_tokens=64)
    model = PagedFakeModel(4, sched.block_manager)
    reqs = [make_req(f"r{i}", prompt_len=6, max_tokens=10, ignore_eos=True) for i in range(3)]
    for req in reqs:
        req.grammar = FakeGrammar(1000)
        sched.add(req)
    for _ in range(200):
        if not sched.has_work:
            break
        batch = sched.schedule()
        if not batch:
            continue
        sampled = model.run(batch)
        for seq, token_id in zip(batch.sampled_seqs, sampled):
            seq.req.grammar.accept(token_id)
        sched.update(batch, sampled)
    assert sched.num_preemptions > 0
    for req in reqs:
        assert req.grammar.accepted == req.output_ids and len(req.output_ids) == 10
