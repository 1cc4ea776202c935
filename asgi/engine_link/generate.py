"""One API request on the engine: submit its choices, turn token ids into text deltas.

Every request streams internally; the non-streaming answer is aggregated from these deltas.
The loop wakes on engine output, on the client's disconnect, or when a keep-alive is due.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec

from rill.asgi.engine_link.client import ENGINE_DEAD, EngineClient, EngineDead
from rill.asgi.engine_link.mailbox import Mailbox
from rill.asgi.errors import APIError, engine_unavailable, queue_full
from rill.asgi.http.request_context import current
from rill.asgi.output.detokenizer import Detokenizer
from rill.asgi.requests.cache_salt import engine_salt, images_salt
from rill.ipc.logprobs import TokenLogprobs
from rill.ipc.protocol import FinishReason, SamplingParams, Verdict

FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}
KEEPALIVE = object()
SHUTDOWN_ABORT = "The server is shutting down and the request did not finish within its shutdown timeout."
REQUEST_TIMEOUT = "The request did not finish within the server's request timeout and was ended."


@dataclass
class ChoiceDelta:
    index: int
    text: str
    finish_reason: str | None = None
    # Of every token since the choice's previous delta (text held back included).
    logprobs: TokenLogprobs | None = None
    # On the choice's first delta, when the request asked (SamplingParams.prompt_logprobs): prompt
    # tokens 1..n-1's (None for a one-token prompt).
    prompt_logprobs: TokenLogprobs | None = None
    # With return_token_ids: every token id since the choice's previous delta, its stop token included.
    token_ids: list[int] | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # With a predicted output (chat's `prediction`): [accepted, rejected] predicted tokens the model verified.
    prediction_tokens: list[int] | None = None

    def as_dict(self) -> dict:
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        if self.prediction_tokens is not None:
            accepted, rejected = self.prediction_tokens
            usage["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                                  "rejected_prediction_tokens": rejected}
        return usage


class GenerationFailed(APIError):
    """The engine could not finish the request (it died, a step failed, or the drain timed out), or its LoRA
    adapter went away meanwhile (a 404 naming `model`). An APIError, answered as one by the app; a stream that
    already began ends with it as its last event instead (asgi/output/respond.py)."""

    def __init__(self, message: str, status: int = 500, code: str = "engine_error"):
        gone = status == 404
        super().__init__(status, message, type="invalid_request_error" if gone else "server_error",
                         param="model" if gone else None, code=code)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def engine_id(request_id: str, choice: int) -> str:
    """The engine's id of one choice of a request (each choice is its own engine request)."""
    return f"{request_id}-{choice}"


class Generation:
    """`n` choices per prompt, each its own engine request: choice index = prompt index * n + j."""

    def __init__(self, client: EngineClient, request_id: str, prompts: list[list[int]],
                 params: SamplingParams, make_detokenizer: Callable[[], Detokenizer], n: int = 1,
                 cache_salt: str | None = None, return_token_ids: bool = False):
        """`cache_salt`: the request's own (vLLM's field); every request is salted with its API key's besides,
        here where every prompt passes on its way to the engine, so that no route can forget it.
        `return_token_ids`: each delta carries its token ids (vLLM's field)."""
        self.ctx = current()  # the HTTP request's context, filled in as tokens come
        self.client = client
        self.request_id = request_id
        self.prompts = prompts
        salt = engine_salt(self.ctx.cache_namespace if self.ctx is not None else "", cache_salt)
        if params.images is not None:  # a prompt's ids are alike for any image: its blocks are the images' too
            salt = images_salt(salt, params.images.digest)
        # a copy: params may be a route's shared constant, or serve another Generation
        self.params = msgspec.structs.replace(params, cache_salt=salt) if salt else params
        self.n = n
        self.num_choices = num_choices = len(prompts) * n
        self.mailbox = Mailbox(num_choices)
        self.detokenizers = [make_detokenizer() for _ in range(num_choices)]
        self.finished = [False] * num_choices
        self.engine_ids = [engine_id(request_id, i) for i in range(num_choices)]
        self.disconnected = False
        # What a CANCELLED delta (a cancel from another API worker) does; by default, stop waiting.
        self.on_cancel: Callable[[], None] = self.on_disconnect
        self.finish_reasons: list[str | None] = [None] * num_choices
        self._stopped_early: list[str] = []  # engine ids whose stop string the worker matched
        self.rejected = False  # refused by admission control (a 429): never ran, nothing to record
        self.failure_reason = "error"  # how a failed request is counted: error, or timeout
        # max_tokens 0 (completions' echo, to score a prompt): no output, finish "length".
        self.score_only = params.max_tokens == 0
        # Logprobs of tokens whose text the detokenizer still holds back, per choice.
        self._held_logprobs: list[list[TokenLogprobs]] = [[] for _ in range(num_choices)]
        # Token ids not yet in a delta, per choice (return_token_ids; None: not asked).
        self._held_ids: list[list[int]] | None = [[] for _ in range(num_choices)] if return_token_ids else None

    async def start(self) -> None:
        """Submits every choice at once; raises the 429 when admission control refuses them."""
        try:
            admission = await self.client.submit(self.engine_ids, self.prompts, self.params, self.mailbox, n=self.n)
        except EngineDead:
            raise engine_unavailable(ENGINE_DEAD) from None
        except asyncio.CancelledError:  # the engine may admit them after all: it must not run them
            await self.client.abort(self.engine_ids)
            raise
        if admission is not None and admission.verdict is not Verdict.ADMITTED:
            self.rejected = True
            self.finished = [True] * self.num_choices
            if admission.verdict in (Verdict.TOO_MANY_REQUESTS, Verdict.TOO_MANY_TOKENS):
                raise self._too_large(admission)
            raise queue_full(admission.verdict is Verdict.QUEUE_TOKENS_FULL, admission.retry_after_s)

    def _too_large(self, admission) -> APIError:
        """400: larger than a queue bound on its own, so no retry would ever be admitted."""
        if admission.verdict is Verdict.TOO_MANY_REQUESTS:
            what = (f"{self.num_choices} sequences ({len(self.prompts)} prompts x n={self.n})" if len(self.prompts) > 1
                    else f"{self.num_choices} sequences (n={self.n})")
            return APIError(400, f"This request asks for {what}; this server runs and queues at most {admission.limit} "
                                 "at a time (--max-num-seqs + --max-queued-requests).", param="n",
                            code="request_too_large")
        num_tokens = self.n * sum(len(ids) for ids in self.prompts)
        return APIError(400, f"This request brings {num_tokens} prompt tokens (all prompts x n); this server queues "
                             f"at most {admission.limit} (--max-queued-tokens).", code="request_too_large")

    def on_disconnect(self) -> None:
        self.disconnected = True
        self.mailbox.wake()

    async def deltas(self, keepalive_due_in: Callable[[], float] | None = None) -> AsyncIterator:
        """Yields lists of ChoiceDelta, or KEEPALIVE when nothing came for a keep-alive period."""
        try:
            while not all(self.finished):
                timeout = max(keepalive_due_in(), 0.0) if keepalive_due_in else None
                if not await self.mailbox.wait(timeout):
                    yield KEEPALIVE
                    continue
                if self.disconnected:
                    return
                if self.mailbox.error:
                    raise GenerationFailed(self.mailbox.error, status=503)
                out = [d for i in range(self.num_choices) if not self.finished[i] and (d := self._advance(i))]
                if self._stopped_early:
                    await self.client.abort(self._stopped_early)
                    self._stopped_early = []
                if out:
                    yield out
        finally:
            unfinished = [rid for rid, done in zip(self.engine_ids, self.finished) if not done]
            if unfinished:  # client gone, stop string, or error: free the engine's work now
                await self.client.abort(unfinished)

    def _advance(self, index: int) -> ChoiceDelta | None:
        choice = self.mailbox.choices[index]
        detok = self.detokenizers[index]
        ids, logprobs = self.mailbox.take(index)
        if self.score_only:  # max_tokens 0: the engine samples one token at the prompt's end; drop it
            ids, logprobs = [], None
        if ids and self.ctx is not None:
            self.ctx.token(len(ids), index)
        if logprobs is not None:
            self._held_logprobs[index].append(logprobs)
        if self._held_ids is not None:
            self._held_ids[index].extend(int(t) for t in ids)  # the stop token too, as vLLM's token_ids
        if choice.finish is FinishReason.STOP and len(ids) and not detok.include_stop:
            # The engine's stop is the last id (eos or a stop_token_ids id, also what ends a
            # grammar): as vLLM, its text is not output unless include_stop_str_in_output.
            ids = ids[:-1]
        text = detok.push(ids) if len(ids) else ""
        if detok.stop_matched is not None:
            finish = "stop"
            if choice.finish is None:
                self._stopped_early.append(self.engine_ids[index])
        elif choice.finish is not None:
            if choice.finish is FinishReason.CANCELLED:
                self.on_cancel()
                return None
            if choice.finish is FinishReason.ABORT:  # only the engine's AbortAll reaches us
                raise GenerationFailed(SHUTDOWN_ABORT, status=503, code="shutting_down")
            if choice.finish is FinishReason.TIMEOUT:  # the engine freed it: nothing to abort
                self.failure_reason = "timeout"
                raise GenerationFailed(REQUEST_TIMEOUT, status=504, code="request_timeout")
            if choice.finish is FinishReason.NO_ADAPTER:  # unloaded since this worker last heard
                raise GenerationFailed("The model (a LoRA adapter) does not exist any more.", status=404,
                                       code="model_not_found")
            if choice.finish not in FINISH_REASONS:
                raise GenerationFailed("The engine failed to complete the request.")
            text += detok.flush()
            finish = "length" if self.score_only else FINISH_REASONS[choice.finish]
        else:
            finish = None
        if finish is not None:
            self.finished[index] = True
            self.finish_reasons[index] = finish
        if not text and not finish:
            return None
        held, self._held_logprobs[index] = self._held_logprobs[index], []
        prompt_logprobs, choice.prompt_logprobs = choice.prompt_logprobs, None
        token_ids = None
        if self._held_ids is not None:
            token_ids, self._held_ids[index] = self._held_ids[index], []
        return ChoiceDelta(index, text, finish, TokenLogprobs.concat(held) if held else None, prompt_logprobs,
                           token_ids)

    def record(self, failed: bool = False) -> None:
        """Token counts and how the request ended, into the request's context."""
        ctx = self.ctx
        if ctx is None or self.rejected:
            return
        usage = self.usage()
        ctx.prompt_tokens, ctx.output_tokens = usage.prompt_tokens, usage.completion_tokens
        ctx.cached_tokens = usage.cached_tokens
        ctx.engine_timings = [c.timings for c in self.mailbox.choices if c.timings is not None]
        ctx.params, ctx.n = self.params, self.n  # for the trace's sampling attributes
        ctx.disconnected = self.disconnected
        if failed:
            ctx.finish_reason = self.failure_reason
        elif self.disconnected or not all(self.finished):
            ctx.finish_reason = "abort"
        else:  # one reason per request: length if any choice ran out, else stop
            ctx.finish_reason = "length" if "length" in self.finish_reasons else "stop"

    def usage(self) -> Usage:
        """So far. A prompt counts once however many choices it has (as OpenAI and vLLM count)."""
        usage = Usage()
        choices = self.mailbox.choices
        for i, prompt in enumerate(self.prompts):
            group = choices[i * self.n : (i + 1) * self.n]
            usage.prompt_tokens += len(prompt)  # what the engine reports, known from the start
            usage.cached_tokens += next((c.num_cached_tokens for c in group if c.num_prompt_tokens), 0)
            usage.completion_tokens += 0 if self.score_only else sum(c.num_output_tokens for c in group)
        if self.params.prediction:
            counts = [c.prediction_tokens for c in choices if c.prediction_tokens is not None]
            usage.prediction_tokens = [sum(c[0] for c in counts), sum(c[1] for c in counts)]
        return usage
