"""Thinking budgets (SamplingParams.thinking): once a request has thought for its budget of tokens, the
sampler writes the reasoning parser's end marker for it, one token a step, and the answer follows.

As vLLM's thinking_token_budget and llama.cpp's --reasoning-budget: the model is cut off mid-thought
rather than asked to wrap up. The count is the output's tokens from its first (the opening `<think>`
included); a model that ends its thinking itself within the budget (`</think>`; harmony's `<|end|>`, closed_ids)
is left alone.
"""
from __future__ import annotations

import torch

from rill.engine_proc.sched.batch import ScheduledSeq
from rill.ipc.protocol import ThinkingBudget


class ThinkingState:
    """One request's place against its budget (EngineRequest.thinking): read from its output ids, so a
    request preempted and recomputed (its output kept) carries on where it was."""

    __slots__ = ("done", "forcing")

    def __init__(self) -> None:
        self.done = False  # the thinking has ended (or the output does not think): nothing more to do
        self.forcing = False  # the budget ran out: the end marker is being written

    def forced_token(self, budget: ThinkingBudget, output: list[int]) -> int | None:
        """The token this step must be, given the output so far; None: the model's own choice."""
        if self.done:
            return None
        end, opening = budget.end_ids, budget.open_ids
        closed = budget.closed_ids if budget.closed_ids and not self.forcing else end
        if _ends_with(output, end) or _ends_with(output, closed):
            self.done = True  # ended, by the model or by us
            return None
        if opening:
            if output[:len(opening)] != opening[:len(output)]:
                self.done = True  # the output does not open with the thinking: no thinking to cut
                return None
            if len(output) < len(opening):
                return None
        if not self.forcing and len(output) < budget.max_tokens:
            return None
        self.forcing = True
        return end[_written(end, output)]


def _ends_with(output: list[int], ids: list[int]) -> bool:
    return len(output) >= len(ids) and output[len(output) - len(ids):] == ids


def _written(end: list[int], output: list[int]) -> int:
    """How much of `end` the output's tail already holds (the part being written)."""
    for n in range(min(len(end) - 1, len(output)), 0, -1):
        if output[len(output) - n:] == end[:n]:
            return n
    return 0


def force_thinking_ends(token_ids: torch.Tensor, seqs: list[ScheduledSeq]) -> torch.Tensor:
    """`token_ids` with each budgeted row's forced token in place of the sampled one."""
    for row, seq in enumerate(seqs):
        req = seq.req
        if req.params.thinking is None:
            continue
        if req.thinking is None:
            req.thinking = ThinkingState()
        forced = req.thinking.forced_token(req.params.thinking, req.output_ids)
        if forced is not None:
            token_ids[row] = forced
    return token_ids
