"""vLLM's `use_beam_search`: one API request searched beam by beam, each step a Generation of its own.

Each step runs every live beam of every prompt one token further (max_tokens 1, the top K raw logprobs,
asgi/engine_link/beams.py says which K), as vLLM's API-level beam search does: the engine's prefix cache
holds what the beams share, so a step computes only each beam's last tokens. The answer comes whole at
the end (streamed as one delta a choice, as vLLM streams it). Between steps the request is back in the
engine's queue, behind whatever waits: a search never holds a batch slot other requests need.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import msgspec

from rill.asgi.engine_link.beams import Beam, BeamSet
from rill.asgi.engine_link.client import EngineClient
from rill.asgi.engine_link.generate import (
    KEEPALIVE,
    REQUEST_TIMEOUT,
    ChoiceDelta,
    Generation,
    GenerationFailed,
    Usage,
)
from rill.asgi.errors import APIError
from rill.asgi.http.request_context import current
from rill.asgi.output.detokenizer import Detokenizer
from rill.ipc.protocol import SamplingParams


class BeamGeneration:
    """`width` beams per prompt, answered as `width` choices a prompt (choice index = prompt index * width + j),
    best first. Quacks as a Generation for asgi/output/respond.py."""

    def __init__(self, client: EngineClient, request_id: str, prompts: list[list[int]], params: SamplingParams,
                 make_detokenizer: Callable[[], Detokenizer], *, width: int, end_ids: frozenset[int],
                 length_penalty: float = 1.0, early_stopping: bool = False, timeout_s: float = 0.0,
                 cache_salt: str | None = None, return_token_ids: bool = False):
        """`params`: the request's (max_tokens, min_tokens, logprobs, the LoRA adapter, images, priority);
        `end_ids`: the tokens that end a beam (none with ignore_eos); `timeout_s`: --request-timeout, over the
        whole search (0: none)."""
        self.ctx = current()
        self.client = client
        self.request_id = request_id
        self.prompts = prompts
        self.params = params
        self.n = width
        self.num_choices = len(prompts) * width
        self.make_detokenizer = make_detokenizer
        self.include_stop = make_detokenizer().include_stop
        self.cache_salt = cache_salt
        self.return_token_ids = return_token_ids
        self.searches = [BeamSet(width, params.max_tokens, end_ids, length_penalty=length_penalty,
                                 early_stopping=early_stopping, min_tokens=params.min_tokens) for _ in prompts]
        top = max(BeamSet.top_k(width, len(end_ids)), params.logprobs or 0)
        # Greedy, one token, no end: only the logprobs (raw: before any sampling option) are read.
        self.step_params = msgspec.structs.replace(
            params, max_tokens=1, min_tokens=0, ignore_eos=True, stop_token_ids=[], temperature=0.0, top_p=1.0,
            top_k=0, min_p=0.0, seed=None, logprobs=top, prompt_logprobs=None)
        self.deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        self.disconnected = False
        self.rejected = False
        self.failure_reason = "error"
        self.finish_reasons: list[str | None] = [None] * self.num_choices
        self.num_cached_tokens = 0
        self.num_steps = 0
        self._answers: list[Beam] = []
        self._step: Generation | None = None
        self._owners: list[int] = []  # the prompt of each beam of the running step

    async def start(self) -> None:
        """The first step: a 400 or 429 of the engine's admission comes now, before any byte is sent."""
        try:
            await self._next_step()
        except APIError:
            self.rejected = True
            raise

    def on_disconnect(self) -> None:
        self.disconnected = True
        if self._step is not None:
            self._step.on_disconnect()

    async def _next_step(self) -> None:
        beams = [(i, beam) for i, search in enumerate(self.searches) for beam in search.live]
        self._owners = [i for i, _ in beams]
        step = Generation(self.client, f"{self.request_id}-beam{self.num_steps}",
                          [self.prompts[i] + beam.tokens for i, beam in beams], self.step_params,
                          self.make_detokenizer, cache_salt=self.cache_salt)
        step.ctx = None  # the request's metrics count the answer's tokens, not the steps'
        self._step = step
        await step.start()
        self.num_steps += 1

    async def deltas(self, keepalive_due_in: Callable[[], float] | None = None) -> AsyncIterator:
        """KEEPALIVE while the search runs, then one list of every choice's whole delta."""
        while True:
            step = self._step
            tops: list = [None] * step.num_choices
            async for item in step.deltas(keepalive_due_in):
                if item is KEEPALIVE:
                    yield KEEPALIVE
                    continue
                for delta in item:
                    if delta.logprobs is not None:
                        tops[delta.index] = (delta.logprobs.token_ids[0, 1:], delta.logprobs.logprobs[0, 1:])
            if self.disconnected:
                return
            if any(top is None for top in tops):
                raise GenerationFailed("The engine gave a beam no logprobs.")
            if self.num_steps == 1:
                self.num_cached_tokens = sum(c.num_cached_tokens for c in step.mailbox.choices)
            for i, search in enumerate(self.searches):
                if search.live:
                    search.advance([top for top, owner in zip(tops, self._owners) if owner == i])
            if all(search.done for search in self.searches):
                break
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.failure_reason = "timeout"
                raise GenerationFailed(REQUEST_TIMEOUT, status=504, code="request_timeout")
            try:
                await self._next_step()
            except APIError as exc:  # a later step refused (the queue filled meanwhile): the request fails
                raise GenerationFailed(exc.message, status=exc.status, code=exc.code or "engine_error") from None
        yield self._answer()

    def _answer(self) -> list[ChoiceDelta]:
        out = []
        for i, search in enumerate(self.searches):
            for j, beam in enumerate(search.best()):
                index = i * self.n + j
                ids = beam.tokens
                if beam.finish_reason == "stop" and not self.include_stop:
                    ids = ids[:-1]  # the end token's text is not output (its logprob is), as a Generation's
                detok = self.make_detokenizer()
                text = (detok.push(ids) if ids else "") + detok.flush()
                self.finish_reasons[index] = beam.finish_reason
                self._answers.append(beam)
                if self.ctx is not None and beam.tokens:
                    self.ctx.token(len(beam.tokens), index)
                out.append(ChoiceDelta(index, text, beam.finish_reason, beam.logprobs() if self.params.logprobs
                                       is not None else None, None, list(beam.tokens) if self.return_token_ids
                                       else None))
        return out

    def usage(self) -> Usage:
        """The prompts once each, the answers' tokens (as vLLM counts a beam search), the first step's cache hits."""
        return Usage(prompt_tokens=sum(len(p) for p in self.prompts),
                     completion_tokens=sum(len(beam.tokens) for beam in self._answers),
                     cached_tokens=self.num_cached_tokens)

    def record(self, failed: bool = False) -> None:
        ctx = self.ctx
        if ctx is None or self.rejected:
            return
        usage = self.usage()
        ctx.prompt_tokens, ctx.output_tokens, ctx.cached_tokens = (usage.prompt_tokens, usage.completion_tokens,
                                                                  usage.cached_tokens)
        ctx.engine_timings = []
        ctx.params, ctx.n = self.params, self.n
        ctx.disconnected = self.disconnected
        if failed:
            ctx.finish_reason = self.failure_reason
        elif self.disconnected or not self._answers:
            ctx.finish_reason = "abort"
        else:
            ctx.finish_reason = "length" if "length" in self.finish_reasons else "stop"
