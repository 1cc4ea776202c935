"""NVIDIA Dynamo's `nvext` request extension: sampling overrides, stream annotations, response fields.

As Dynamo documents it: `greed_sampling` (also spelled `greedy_sampling`) forces greedy decoding;
`ignore_eos`, `top_k` and `repetition_penalty` override the request's own; `use_raw_prompt` sends
a completions prompt to the tokenizer as is (always so here: completions get no template; Dynamo
does not implement it for chat, nor does Rill: 400); `annotations` ask for out-of-band SSE events
(`event: <name>` and the value as JSON in a `:` comment line, Dynamo's framing); `extra_fields`
ask for an `nvext` object in the response. Unknown names get a 400 rather than being ignored.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

import msgspec
from msgspec import Meta

from rill.asgi.engine_link.generate import Generation
from rill.asgi.errors import APIError
from rill.asgi.requests.bounds import MAX_SMALL_LIST, Name
from rill.ipc.protocol import SamplingParams

INT64_MAX = 2**63 - 1
# Sent at the start of a stream (what the request became), or at its end (how it went).
START_ANNOTATIONS = frozenset({"token_ids", "formatted_prompt"})
END_ANNOTATIONS = frozenset({"timing"})
EXTRA_FIELDS = frozenset({"timing", "completion_token_ids"})


class NvExt(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    greed_sampling: bool | None = None
    greedy_sampling: bool | None = None  # the spelling some Dynamo docs use
    ignore_eos: bool | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT64_MAX)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0, le=2)] | None = None
    use_raw_prompt: bool | None = None
    annotations: Annotated[list[Name], Meta(max_length=MAX_SMALL_LIST)] | None = None
    extra_fields: Annotated[list[Name], Meta(max_length=MAX_SMALL_LIST)] | None = None

    def check(self, *, chat: bool) -> None:
        """400 for what this server cannot do, naming the field."""
        if chat and self.use_raw_prompt:
            raise APIError(400, "`nvext.use_raw_prompt` applies to /v1/completions only (chat prompts are "
                                "always rendered by the chat template).", param="nvext.use_raw_prompt")
        for field, known in (("annotations", START_ANNOTATIONS | END_ANNOTATIONS), ("extra_fields", EXTRA_FIELDS)):
            for i, name in enumerate(getattr(self, field) or ()):
                if name not in known:
                    raise APIError(400, f"Unknown `nvext.{field}` entry {name!r}; known: {', '.join(sorted(known))}.",
                                   param=f"nvext.{field}[{i}]")

    def apply(self, params: SamplingParams) -> SamplingParams:
        """The engine's parameters with this extension's overrides."""
        changes = {}
        if self.greed_sampling or self.greedy_sampling:
            changes["temperature"] = 0.0
        if self.ignore_eos is not None:
            changes["ignore_eos"] = self.ignore_eos
        if self.top_k is not None:
            changes["top_k"] = max(self.top_k, 0)
        if self.repetition_penalty is not None:
            changes["repetition_penalty"] = self.repetition_penalty
        return msgspec.structs.replace(params, **changes) if changes else params

    def wants(self, annotation: str) -> bool:
        return annotation in (self.annotations or ())

    def wants_field(self, name: str) -> bool:
        return name in (self.extra_fields or ())


class NvExtReply:
    """What a request's nvext asks to be sent back: SSE annotation events and the response's `nvext`.

    A stream sends `token_ids` and `formatted_prompt` (what the request became) after its headers
    and `timing` before [DONE], each as an annotation event, and the `extra_fields` in a last
    chunk with no choices. A plain answer carries both, by name, in its body's `nvext` object.
    """

    def __init__(self, ext: NvExt, prompts: list[list[int]], decode: Callable[[list[int]], str]):
        self.ext = ext
        self.prompts = prompts
        self.decode = decode

    @classmethod
    def of(cls, ext: NvExt | None, prompts: list[list[int]], decode: Callable[[list[int]], str]) -> NvExtReply | None:
        return cls(ext, prompts, decode) if ext is not None and (ext.annotations or ext.extra_fields) else None

    def _one_or_all(self, values: list):
        return values[0] if len(values) == 1 else values

    def start_values(self) -> dict:
        values = {}
        if self.ext.wants("token_ids"):
            values["token_ids"] = self._one_or_all(self.prompts)
        if self.ext.wants("formatted_prompt"):
            values["formatted_prompt"] = self._one_or_all([self.decode(ids) for ids in self.prompts])
        return values

    def end_values(self, gen: Generation) -> dict:
        return {"timing": timing(gen)} if self.ext.wants("timing") else {}

    def start_events(self) -> list[bytes]:
        return [annotation_event(name, value) for name, value in self.start_values().items()]

    def end_events(self, gen: Generation) -> list[bytes]:
        return [annotation_event(name, value) for name, value in self.end_values(gen).items()]

    def fields(self, gen: Generation) -> dict:
        """The response's `nvext` object (empty: none is sent)."""
        return {"timing": timing(gen)} if self.ext.wants_field("timing") else {}

    def body_fields(self, gen: Generation) -> dict:
        """A plain answer has no events: the annotations join its `nvext` object, by name."""
        return {**self.start_values(), **self.end_values(gen), **self.fields(gen)}


def timing(gen: Generation) -> dict:
    """Dynamo's TimingInfo of a request, in milliseconds; the engine's split of its first choice."""
    ctx = gen.ctx
    if ctx is None:
        return {}
    now = time.perf_counter()
    info: dict = {"request_received_ms": int((time.time() - (now - ctx.start_s)) * 1000)}
    engine = next((c.timings for c in gen.mailbox.choices if c.timings is not None), None)
    if engine is not None:  # the queue is Dynamo's prefill wait
        info["prefill_wait_time_ms"] = engine.queue_s * 1000
        info["prefill_time_ms"] = engine.prefill_s * 1000
    if ctx.ttft_s is not None:
        info["ttft_ms"] = ctx.ttft_s * 1000
    info["total_time_ms"] = (now - ctx.start_s) * 1000
    usage = gen.usage()
    if usage.prompt_tokens:
        info["kv_hit_rate"] = usage.cached_tokens / usage.prompt_tokens
    return info


def annotation_event(name: str, value) -> bytes:
    """One SSE event as Dynamo frames annotations: the name, and the value as JSON in a comment."""
    return b"event: " + name.encode() + b"\n: " + msgspec.json.encode(value) + b"\n\n"
