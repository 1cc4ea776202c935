"""The scheduler's side of speculative decoding: which decodes get drafts, how many, and the counts."""
from __future__ import annotations

from dataclasses import dataclass, field

from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.spec.prediction import prediction_drafts

# Drafts a step from a predicted output, at most: verifying 17 rows costs a CPU decode step little more than 1.
PREDICTION_TOKENS = 16


@dataclass
class SpecStats:
    """vLLM's spec_decode counters: verified drafts, their tokens, those accepted, by position."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_drafted:
            self.accepted_per_pos.extend([0] * (num_drafted - len(self.accepted_per_pos)))
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1


class Speculator:
    """Asks the proposer for a decode's drafts: never past max_tokens, the model's length or the
    cache, never for a request with a grammar or a thinking budget (which would have to take the drafts first),
    and not at all in a step with more than `disable_by_batch_size` running requests (0: no limit),
    where verifying costs more than the drafts save.

    A request with a predicted output drafts from it first (up to `prediction_tokens` a step), and from
    the proposer where the output has left it. Without --speculative-config the proposer is None: only
    such requests draft."""

    def __init__(self, proposer, num_speculative_tokens: int, disable_by_batch_size: int = 0,
                 prediction_tokens: int = PREDICTION_TOKENS) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.prediction_tokens = prediction_tokens
        self.stats = SpecStats(accepted_per_pos=[0] * num_speculative_tokens)

    def drafts(self, req: EngineRequest, start_pos: int, budget: int, num_running: int, max_len: int) -> list[int]:
        """`max_len`: the most tokens a request may reach (the model's length, the cache's)."""
        num_tokens = req.num_tokens
        if num_tokens - start_pos != 1 or req.grammar is not None or req.params.thinking is not None:
            return []  # a grammar's matcher, a thinking budget's count, would have to take the drafts first
        if self.disable_by_batch_size and num_running > self.disable_by_batch_size:
            return []
        room = min(budget - 1, max_len - num_tokens - 1, req.params.max_tokens - len(req.output_ids) - 1)
        if req.params.prediction:
            drafts = prediction_drafts(req, max(0, min(self.prediction_tokens, room)))
            if drafts or self.proposer is None:
                return drafts
        if self.proposer is None:
            return []
        most = min(self.num_speculative_tokens, room)
        return self.proposer.propose(req, most) if most > 0 else []

    def record(self, req: EngineRequest, draft_ids: list[int], num_accepted: int) -> None:
        self.stats.record(len(draft_ids), num_accepted)
        if req.prediction is not None and req.prediction.drafted:
            req.prediction.record(len(draft_ids), num_accepted)
