"""Speculative decoding in the scheduler: drafts scheduled after a decode, kept or rolled back,
checked against the paged fake model (which reads every history back through the block tables)."""
from __future__ import annotations

import pytest

from rill.engine_proc.spec.ngram import NgramProposer
from rill.engine_proc.spec.speculator import Speculator
from rill.ipc.protocol import FinishReason
from tests.helpers.scheduling import EOS, assert_all_blocks_free, fake_next, make_req, make_scheduler, reference_output
from tests.helpers.spec_fakes import FakeVerifier, run


class OracleProposer:
    """Drafts the fake model's own next tokens, the `wrong_at`-th of them (0-based) wrong."""

    def __init__(self, wrong_at: int | None = None) -> None:
        self.wrong_at = wrong_at
        self.calls = 0

    def propose(self, req, max_drafts: int) -> list[int]:
        self.calls += 1
        ids = req.token_ids(0, req.num_tokens)
        drafts = []
        for j in range(max_drafts):
            token = fake_next(ids)
            if j == self.wrong_at:
                token = token + 1
            drafts.append(token)
            ids = ids + [token]
        return drafts


@pytest.mark.parametrize("wrong_at", [None, 0, 2])
def test_output_is_the_models_whatever_the_drafts(wrong_at):
    proposer = OracleProposer(wrong_at)
    sched = make_scheduler(speculator=Speculator(proposer, 4))
    reqs = [make_req(f"r{i}", prompt_len=5 + 3 * i, max_tokens=23) for i in range(3)]
    for r in reqs:
        sched.add(r)
    streamed, finishes, batches = run(sched, FakeVerifier(4, sched.block_manager))
    for r in reqs:
        assert streamed[r.req_id] == reference_output(r.prompt_ids, 23)
        assert finishes[r.req_id] == FinishReason.LENGTH
    assert proposer.calls > 0
    stats = sched.speculator.stats
    assert stats.num_draft_tokens > 0
    if wrong_at is None:  # every draft kept: about 5 tokens a step
        assert stats.num_accepted_tokens == stats.num_draft_tokens
        assert len(batches) < 3 + 23 // 4 + 2
    else:
        assert stats.num_accepted_tokens == wrong_at * stats.num_drafts
        assert stats.accepted_per_pos[wrong_at] == 0
    assert_all_blocks_free(sched)


def test_drafts_stop_at_max_tokens_and_the_budget():
    sched = make_scheduler(speculator=Speculator(OracleProposer(), 8), max_num_batched_tokens=4)
    req = make_req("a", prompt_len=3, max_tokens=6)
    sched.add(req)
    streamed, _, batches = run(sched, FakeVerifier(4, sched.block_manager))
    assert streamed["a"] == reference_output(req.prompt_ids, 6)
    for step in batches:
        for _, _, num_new, drafts in step:
            assert num_new <= 4
    # max_tokens 6: the prefill samples 1, then at most 5 more (1 + 4 drafts kept), never past it
    assert sum(len(d) for step in batches for *_, d in step) <= 4


def test_a_stop_token_among_the_drafts_ends_the_request_there():
    class EosAt:
        def propose(self, req, max_drafts):
            return [fake_next(req.token_ids(0, req.num_tokens)), EOS, 7][:max_drafts]

    class EosModel(FakeVerifier):  # samples EOS right after the first draft
        def run(self, batch):
            out = super().run(batch)
            for i, seq in enumerate(batch.sampled_seqs):
                if seq.draft_ids[:2] == [out.spec_ids[i][0], EOS] and len(out.spec_ids[i]) >= 2:
                    out.spec_ids[i] = [out.spec_ids[i][0], EOS, 99]
            return out

    sched = make_scheduler(speculator=Speculator(EosAt(), 3))
    sched.add(make_req("a", prompt_len=4, max_tokens=50))
    streamed, finishes, _ = run(sched, EosModel(4, sched.block_manager))
    assert finishes["a"] == FinishReason.STOP
    assert streamed["a"][-1] == EOS and 99 not in streamed["a"]
    assert_all_blocks_free(sched)


def test_off_above_the_batch_size():
    proposer = OracleProposer()
    sched = make_scheduler(speculator=Speculator(proposer, 4, disable_by_batch_size=2))
    for i, max_tokens in enumerate([4, 4, 20]):
        sched.add(make_req(f"r{i}", max_tokens=max_tokens))
    _, _, batches = run(sched, FakeVerifier(4, sched.block_manager))
    assert all(not d for step in batches if len(step) > 2 for *_, d in step)
    assert any(d for step in batches for *_, d in step)  # once two finished, the last one drafts


def test_prefix_cache_sees_only_kept_tokens():
    """A rejected draft's block contents must never be found by a later request's prompt."""
    sched = make_scheduler(speculator=Speculator(OracleProposer(wrong_at=1), 4), block_size=4)
    first = make_req("a", prompt_len=6, max_tokens=20)
    sched.add(first)
    model = FakeVerifier(4, sched.block_manager)
    streamed, _, _ = run(sched, model)
    # A second request whose prompt is the first's whole text: its cached prefix is read back
    # through the fake model, which asserts every slot holds the right history.
    second = make_req("b", prompt_len=0, max_tokens=5)
    second.prompt_ids = first.prompt_ids + streamed["a"]
    sched.add(second)
    streamed2, _, _ = run(sched, model)
    # Every full block of the first request's computed tokens is found: drafts kept included.
    assert second.num_cached_tokens == (len(second.prompt_ids) - 1) // 4 * 4
    assert streamed2["b"] == reference_output(second.prompt_ids, 5)


def test_ngram_proposer_copies_what_followed_the_latest_match():
    proposer = NgramProposer(3, 2, 3)
    req = make_req("a", prompt_len=0)
    req.prompt_ids = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 6, 2, 3]
    # "2 3" last occurred followed by 4 7 8 (the latest match wins over the first)
    assert proposer.propose(req, 5) == [4, 7, 8]
    assert proposer.propose(req, 2) == [4, 7]
    req.output_ids += [4]  # now "2 3 4" (n=3) matches; its latest occurrence is followed by 7 8 6
    assert proposer.propose(req, 5) == [7, 8, 6]
    req.output_ids += [11]
    assert proposer.propose(req, 5) == []  # "4 11" and "3 4 11" never occurred
    req.output_ids += [2, 3, 4, 11]  # the suffix itself is never its own match, an earlier one is
    assert proposer.propose(req, 5) == [2, 3, 4]


def test_ngram_drafts_at_the_end_run_into_the_suffix():
    proposer = NgramProposer(4, 1, 1)
    req = make_req("a", prompt_len=0)
    req.prompt_ids = [5, 5, 5]
    assert proposer.propose(req, 4) == [5]  # what follows the latest earlier 5: one token, the last
