"""What the scheduler hands the model runner for one step, and what comes back."""
from __future__ import annotations

from dataclasses import dataclass, field

from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.logprobs import TokenLogprobs
from rill.ipc.protocol import FinishReason


@dataclass(eq=False)
class ScheduledSeq:
    """A slice of one request's tokens to run this step: a prefill chunk or one decode token."""

    req: EngineRequest
    start_pos: int  # == req.num_computed_tokens before this step
    num_new_tokens: int  # the request's tokens run this step, and its drafts
    # Speculative decoding (engine_proc/spec/): tokens proposed to follow the request's last one,
    # run after it in this step and kept while the target model's samples agree.
    draft_ids: list[int] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        end = self.start_pos + self.num_new_tokens - len(self.draft_ids)
        ids = self.req.token_ids(self.start_pos, end)
        return ids + self.draft_ids if self.draft_ids else ids

    @property
    def needs_sample(self) -> bool:
        """True when this slice reaches the end of the request's known tokens."""
        return self.start_pos + self.num_new_tokens - len(self.draft_ids) == self.req.num_tokens

    @property
    def num_logits_rows(self) -> int:
        """Rows of logits a sampled seq gets: its last token's, and one per draft."""
        return 1 + len(self.draft_ids)

    @property
    def prompt_scored(self) -> range:
        """Positions of this slice whose logits score the prompt token after theirs (prompt
        logprobs asked, and not scored before a preemption); empty for everyone else."""
        req = self.req
        if req.params.prompt_logprobs is None:
            return range(0)
        start = max(self.start_pos, req.num_prompt_scored)
        return range(start, max(start, min(self.start_pos + self.num_new_tokens, len(req.prompt_ids) - 1)))


@dataclass(eq=False)
class Batch:
    """One flattened step: sequences in order; token ids laid end to end, no padding."""

    seqs: list[ScheduledSeq] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def sampled_seqs(self) -> list[ScheduledSeq]:
        return [s for s in self.seqs if s.needs_sample]

    @property
    def scoring_seqs(self) -> list[ScheduledSeq]:
        """Seqs whose prompt logprobs this step computes (their logits rows follow the sampled ones)."""
        return [s for s in self.seqs if s.req.params.prompt_logprobs is not None and s.prompt_scored]

    def __bool__(self) -> bool:
        return bool(self.seqs)


@dataclass(eq=False)
class TokenDelta:
    """What one step produced for one request (also emitted when a request finishes)."""

    req: EngineRequest
    new_ids: list[int]
    finish: FinishReason | None = None
    logprobs: TokenLogprobs | None = None  # of new_ids, when the request asked
