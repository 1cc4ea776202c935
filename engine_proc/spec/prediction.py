"""Drafts from a request's predicted output (OpenAI's Predicted Outputs: chat's `prediction`).

A client editing a file sends the file as the prediction: most of the answer repeats it. The request
keeps a cursor into the predicted ids, the one the output is expected to write next. While the output
follows the prediction, the drafts are the predicted ids from the cursor on. Where the output leaves
it (the edit), the cursor is lost; once the output's last ANCHOR_N tokens occur in the prediction again
(the edit is over and the text resumes), the cursor moves after them: the first such place at or after
where the output left, else the last one before it.

The model verifies every draft (engine_proc/spec/verify.py), so the output is the one the request
gets without a prediction. A step drafts at most twice as many as the last step kept, plus two: where
the output only half follows the prediction, fewer drafts are computed to be thrown away. Each request counts the drafted ids kept and those rejected, which the
answer reports as accepted_prediction_tokens and rejected_prediction_tokens.
"""
from __future__ import annotations

from bisect import bisect_left

from rill.engine_proc.sched.request import EngineRequest

ANCHOR_N = 3  # tokens that must match to pick the prediction up again after the output left it
LOST = -1


class PredictionCursor:
    """One request's place in its prediction, and its counts."""

    __slots__ = ("ids", "pos", "resume_from", "num_seen", "anchors", "width", "drafted", "accepted", "rejected")

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.pos = 0  # the index of the predicted id the output should write next, or LOST
        self.resume_from = 0  # where the output left the prediction: picking it up again prefers later places
        self.num_seen = 0  # output tokens already compared with the prediction
        self.anchors: dict[tuple[int, ...], list[int]] | None = None  # built the first time the output leaves
        self.width = len(ids)  # the most drafts the next step takes
        self.drafted = False  # this step's drafts came from the prediction
        self.accepted = 0
        self.rejected = 0

    def follow(self, output_ids: list[int]) -> None:
        """Moves the cursor over the output tokens written since the last call."""
        ids, pos = self.ids, self.pos
        for token in output_ids[self.num_seen:]:
            if pos != LOST and pos < len(ids) and ids[pos] == token:
                pos += 1
            elif pos != LOST:
                self.resume_from, pos = pos, LOST
        self.num_seen = len(output_ids)
        if pos == LOST and len(output_ids) >= ANCHOR_N:
            pos = self._resume(tuple(output_ids[-ANCHOR_N:]))
        self.pos = pos

    def _resume(self, last: tuple[int, ...]) -> int:
        if self.anchors is None:
            anchors: dict[tuple[int, ...], list[int]] = {}
            ids = self.ids
            for end in range(ANCHOR_N, len(ids) + 1):  # positions after each n-gram, ascending
                anchors.setdefault(tuple(ids[end - ANCHOR_N : end]), []).append(end)
            self.anchors = anchors
        places = self.anchors.get(last)
        if not places:
            return LOST
        i = bisect_left(places, self.resume_from)
        return places[i] if i < len(places) else places[-1]

    def drafts(self, max_drafts: int) -> list[int]:
        pos = self.pos
        return [] if pos == LOST else self.ids[pos : pos + min(max_drafts, self.width)]

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.width = 2 * num_accepted + 2
        self.accepted += num_accepted
        self.rejected += num_drafted - num_accepted


def prediction_drafts(req: EngineRequest, max_drafts: int) -> list[int]:
    """Up to max_drafts predicted ids to follow req's output; [] where it has no prediction or has left it."""
    cursor = req.prediction
    if cursor is None:
        cursor = req.prediction = PredictionCursor(req.params.prediction)
    cursor.follow(req.output_ids)
    drafts = cursor.drafts(max_drafts)
    cursor.drafted = bool(drafts)
    return drafts
