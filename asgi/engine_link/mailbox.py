"""A per-request slot for engine output: merges deltas while the client is slow.

The engine client puts each step's new ids here (with their logprobs when the request asked); the
request's own loop takes everything that accumulated since its last look. Memory stays bounded
by the request's own max_tokens.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rill.ipc.logprobs import TokenLogprobs
from rill.ipc.protocol import FinishReason, RequestTimings


@dataclass(eq=False)
class ChoiceOutput:
    """What one choice (one engine request) has produced and not yet been taken."""

    new_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)  # of new_ids, when asked for
    finish: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    timings: RequestTimings | None = None  # the engine's queue, prefill and decode times, at the end
    # Prompt tokens 1..n-1's logprobs (SamplingParams.prompt_logprobs), with the first token.
    prompt_logprobs: TokenLogprobs | None = None
    embedding: bytes | None = None  # an embedding request's vector: little-endian float32
    prediction_tokens: list[int] | None = None  # [accepted, rejected] predicted tokens drafted, at the end


class Mailbox:
    def __init__(self, num_choices: int):
        self.choices = [ChoiceOutput() for _ in range(num_choices)]
        self.error: str = ""  # set when the engine is gone: every choice fails
        self._ready = asyncio.Event()

    def put(self, index: int, ids, finish: FinishReason | None, num_prompt: int, num_cached: int,
            logprobs: TokenLogprobs | None = None, timings: RequestTimings | None = None) -> None:
        choice = self.choices[index]
        choice.new_ids.extend(ids)
        if logprobs is not None:
            choice.new_logprobs.append(logprobs)
        choice.num_output_tokens += len(ids)
        if num_prompt:
            choice.num_prompt_tokens = num_prompt
            choice.num_cached_tokens = num_cached
        if finish is not None:
            choice.finish = finish
            choice.timings = timings
        self._ready.set()

    def wake(self) -> None:
        self._ready.set()

    def fail(self, message: str) -> None:
        self.error = message
        self._ready.set()

    async def wait(self, timeout_s: float | None) -> bool:
        """True when there is something to take; False on timeout."""
        if not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), timeout_s)
            except TimeoutError:
                return False
        self._ready.clear()
        return True

    def take(self, index: int) -> tuple[list[int], TokenLogprobs | None]:
        """The ids that came since the last take, and their logprobs when the request asked."""
        choice = self.choices[index]
        ids, choice.new_ids = choice.new_ids, []
        if not choice.new_logprobs:
            return ids, None
        parts, choice.new_logprobs = choice.new_logprobs, []
        return ids, TokenLogprobs.concat(parts)
