"""Predicted outputs in the engine: the cursor that follows, loses and finds the prediction again, and the
scheduler's drafts from it, verified by the paged fake model (the output is the model's whatever the prediction)."""
from __future__ import annotations

import pytest

from rill.engine_proc.spec.ngram import NgramProposer
from rill.engine_proc.spec.prediction import LOST, PredictionCursor
from rill.engine_proc.spec.speculator import Speculator
from rill.ipc.protocol import FinishReason
from tests.helpers.scheduling import assert_all_blocks_free, make_req, make_scheduler, reference_output
from tests.helpers.spec_fakes import FakeVerifier, run

MAX_TOKENS = 40


def test_the_cursor_follows_leaves_and_picks_up_the_prediction_again():
    cursor = PredictionCursor([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert cursor.drafts(3) == [1, 2, 3]  # no output yet: from the start
    cursor.follow([1, 2])
    assert cursor.drafts(3) == [3, 4, 5]
    cursor.follow([1, 2, 3, 40, 41])  # an edit: the output leaves the prediction after 3
    assert cursor.pos == LOST and cursor.drafts(3) == []
    cursor.follow([1, 2, 3, 40, 41, 5, 6])  # two tokens back in step: not yet ANCHOR_N
    assert cursor.drafts(3) == []
    cursor.follow([1, 2, 3, 40, 41, 5, 6, 7])
    assert cursor.drafts(3) == [8, 9]  # found after "5 6 7"; the prediction ends there


def test_picking_up_again_prefers_the_place_after_where_the_output_left():
    cursor = PredictionCursor([7, 8, 9, 1, 0, 7, 8, 9, 2, 0, 7, 8, 9, 3])
    cursor.follow([7, 8, 9, 1, 0, 7, 8, 9, 2, 50])  # left at index 9
    cursor.follow([7, 8, 9, 1, 0, 7, 8, 9, 2, 50, 7, 8, 9])
    assert cursor.drafts(2) == [3]  # "7 8 9" ends at 3, 8 and 13: the first at or after 9
    late = PredictionCursor([7, 8, 9, 1, 5, 5, 5])
    late.follow([7, 8, 9, 1, 5, 5, 5, 60, 7, 8, 9])  # ran past the end; only an earlier place is left
    assert late.drafts(2) == [1, 5]


def predicted(reference: list[int], edit_at: int | None) -> list[int]:
    """The reference output with one token changed (a client predicting a file the answer edits)."""
    ids = list(reference)
    if edit_at is not None:
        ids[edit_at] += 1
    return ids


def serve(speculator: Speculator, prediction: list[int]):
    sched = make_scheduler(speculator=speculator, max_num_batched_tokens=64)
    req = make_req("a", prompt_len=6, max_tokens=MAX_TOKENS, prediction=prediction)
    sched.add(req)
    streamed, finishes, batches = run(sched, FakeVerifier(4, sched.block_manager))
    assert finishes["a"] == FinishReason.LENGTH
    assert_all_blocks_free(sched)
    return req, streamed["a"], batches


@pytest.mark.parametrize("edit_at", [None, 0, 12])
def test_output_is_the_models_and_takes_fewer_steps(edit_at):
    reference = reference_output(make_req("a", prompt_len=6).prompt_ids, MAX_TOKENS)
    plain, _, plain_batches = serve(Speculator(None, 0), [])
    req, output, batches = serve(Speculator(None, 0, prediction_tokens=8), predicted(reference, edit_at))
    assert output == reference and plain.output_ids == reference
    assert plain.prediction is None and len(plain_batches) == 1 + MAX_TOKENS - 1  # no drafts without one
    cursor = req.prediction
    drafted = sum(len(d) for step in batches for *_, d in step)
    assert cursor.accepted + cursor.rejected == drafted
    assert len(output) - 1 - cursor.accepted == len(batches) - 1  # one sampled token a step, the rest drafts kept
    assert len(batches) < len(plain_batches) / 3
    if edit_at in (None, 0):  # nothing drafted is wrong: at 0 the first token (the prefill's) leaves it
        assert cursor.rejected == 0
    else:  # the draft that holds the edited token is rejected from there on
        assert 1 <= cursor.rejected <= 8
    if edit_at is None:  # the prefill, then 8 drafts kept and 1 sampled a step
        assert len(batches) == 1 + -(-(MAX_TOKENS - 1) // 9)


def test_the_configured_proposer_drafts_where_the_output_has_left_the_prediction():
    reference = reference_output(make_req("a", prompt_len=6).prompt_ids, MAX_TOKENS)
    prediction = reference[:10] + [1] * 30  # the first 10 right, then nothing like the output

    class Counting(NgramProposer):
        calls = 0

        def propose(self, req, max_drafts):
            Counting.calls += 1
            return super().propose(req, max_drafts)

    req, output, _ = serve(Speculator(Counting(4, 2, 3), 4), prediction)
    assert output == reference
    assert req.prediction.accepted == 9  # 1..16 drafted after the prefill's token 0: 1..9 kept, 10 on are wrong
    assert Counting.calls > 0
