"""The scheduler's side of speculative decoding: which decodes get drafts, how many, and the counts."""
from __future__ import annotations

from dataclasses import dataclass, field

from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.spec.prediction import prediction_drafts

# Drafts a step from a predicted output, at most: verifying 17 rows costs a CPU decode step little more than 1.
PREDICTION_TOKENS = 16
# Drafts a step from what a grammar forces (--jump-forward-tokens): a JSON key and its punctuation.
JUMP_FORWARD_TOKENS = 8
# ... at most this many over a step's running requests (8 each up to 4, 4 at 8), and none in a step of more than
# JUMP_FORWARD_MAX_RUNNING: on a CPU a fuller step is bound by its rows, where a draft row costs about what a decode
# row does, and the ones the model refuses cost more than the kept ones save (docs/structured-outputs.md).
JUMP_FORWARD_STEP_TOKENS = 32
JUMP_FORWARD_MAX_RUNNING = 8


@dataclass
class SpecStats:
    """vLLM's spec_decode counters: verified drafts, their tokens, those accepted, by position."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    num_jump_forward_tokens: int = 0  # of the draft tokens, those a grammar forced, and of those the ones kept
    num_jump_forward_accepted: int = 0

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
    cache, never for a request with a thinking budget (whose count would have to take the drafts first),
    and not at all in a step with more than `disable_by_batch_size` running requests (0: no limit),
    where verifying costs more than the drafts save.

    A request with a grammar (structured outputs, a forced tool call) drafts what its grammar forces next
    (jump-forward: up to `jump_forward_tokens`, 0 off; fewer as steps fill, none past 8 running), else the drafts below that its grammar accepts (a draft
    model's are made after scheduling: none). A request with a predicted output drafts from it first (up to
    `prediction_tokens` a step), and from the proposer where the output has left it. Without
    --speculative-config the proposer is None: only such requests draft."""

    def __init__(self, proposer, num_speculative_tokens: int, disable_by_batch_size: int = 0,
                 prediction_tokens: int = PREDICTION_TOKENS, jump_forward_tokens: int = JUMP_FORWARD_TOKENS) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.prediction_tokens = prediction_tokens
        self.jump_forward_tokens = jump_forward_tokens
        self.stats = SpecStats(accepted_per_pos=[0] * num_speculative_tokens)

    def drafts(self, req: EngineRequest, start_pos: int, budget: int, num_running: int, max_len: int) -> list[int]:
        """`max_len`: the most tokens a request may reach (the model's length, the cache's)."""
        num_tokens = req.num_tokens
        if num_tokens - start_pos != 1 or req.params.thinking is not None:
            return []  # a thinking budget's count would have to take the drafts first
        if self.disable_by_batch_size and num_running > self.disable_by_batch_size:
            return []
        room = min(budget - 1, max_len - num_tokens - 1, req.params.max_tokens - len(req.output_ids) - 1)
        grammar = req.grammar
        if grammar is None:
            return self._proposed(req, room)
        most = 0 if num_running > JUMP_FORWARD_MAX_RUNNING else \
            min(self.jump_forward_tokens, JUMP_FORWARD_STEP_TOKENS // max(1, num_running), room)
        forced = grammar.forced_ids(most)
        grammar.drafted = bool(forced)
        if forced:
            return forced
        # A draft model's drafts are placeholders until the step runs: its grammar could not check them.
        return grammar.valid_prefix(self._proposed(req, room, not getattr(self.proposer, "drafts_later", False)))

    def _proposed(self, req: EngineRequest, room: int, use_proposer: bool = True) -> list[int]:
        if req.params.prediction:
            drafts = prediction_drafts(req, max(0, min(self.prediction_tokens, room)))
            if drafts or self.proposer is None:
                return drafts
        if self.proposer is None or not use_proposer:
            return []
        most = min(self.num_speculative_tokens, room)
        return self.proposer.propose(req, most) if most > 0 else []

    def record(self, req: EngineRequest, draft_ids: list[int], num_accepted: int) -> None:
        self.stats.record(len(draft_ids), num_accepted)
        if req.grammar is not None and req.grammar.drafted:
            self.stats.num_jump_forward_tokens += len(draft_ids)
            self.stats.num_jump_forward_accepted += num_accepted
        if req.prediction is not None and req.prediction.drafted:
            req.prediction.record(len(draft_ids), num_accepted)
