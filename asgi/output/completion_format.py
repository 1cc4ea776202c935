"""The completion's wire shapes: chunks of a stream, and the one body of a plain request."""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from asgi.engine_link.generate import ChoiceDelta, Usage
from asgi.output.chunk_format import ChunkFormatter
from asgi.output.logprobs_format import CompletionLogprobs, merge_completion_logprobs

_encode = msgspec.json.encode


class CompletionFormatter(ChunkFormatter):
    """`echo_texts`: with `echo`, each prompt's text, which opens its choices (choice i: prompt i // n).

    A chunk's finish_reason is null until its choice ends, as OpenAI streams it; the spec (and so
    the SDK's strict mode) reuses the non-streamed schema, where it is not nullable.
    """

    def __init__(self, request_id: str, model: str, num_choices: int, include_usage: bool, *, n: int = 1,
                 echo_texts: list[str] | None = None,
                 make_logprobs: Callable[[], CompletionLogprobs] | None = None):
        super().__init__(request_id, "text_completion", model, include_usage)
        self.num_choices = num_choices
        self.echo = [echo_texts[i // n] for i in range(num_choices)] if echo_texts is not None else None
        self.logprobs = [make_logprobs() for _ in range(num_choices)] if make_logprobs else None
        # The non-streamed answer, built by add().
        self._texts: list[list[str]] = [[] if self.echo is None else [self.echo[i]] for i in range(num_choices)]
        self._logprobs: list[dict] = [{"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                                      for _ in range(num_choices)]
        self._finish_reasons: list[str | None] = [None] * num_choices

    def opening_chunks(self, usage: Usage | None = None) -> list[bytes]:
        """With `echo`, each choice's prompt text first (vLLM streams it the same way)."""
        if self.echo is None:
            return []
        return [self._chunk([{"index": i, "text": text, "logprobs": None, "finish_reason": None}], usage)
                for i, text in enumerate(self.echo)]

    def _choices(self, deltas: list[ChoiceDelta]) -> list[dict]:
        logprobs = self.logprobs
        return [{"index": d.index, "text": d.text,
                 "logprobs": None if logprobs is None else logprobs[d.index].piece(d.logprobs),
                 "finish_reason": d.finish_reason} for d in deltas]

    def chunks(self, deltas: list[ChoiceDelta], usage: Usage | None = None) -> list[bytes]:
        """One chunk per choice, as OpenAI and vLLM stream several choices."""
        return [self._chunk([choice], usage) for choice in self._choices(deltas)]

    def add(self, deltas: list[ChoiceDelta]) -> None:
        for choice in self._choices(deltas):
            i = choice["index"]
            self._texts[i].append(choice["text"])
            if choice["logprobs"] is not None:
                merge_completion_logprobs(self._logprobs[i], choice["logprobs"])
            self._finish_reasons[i] = choice["finish_reason"] or self._finish_reasons[i]

    def body(self, usage: Usage) -> bytes:
        choices = [{"index": i, "text": "".join(self._texts[i]),
                    "logprobs": None if self.logprobs is None else self._logprobs[i],
                    "finish_reason": self._finish_reasons[i]} for i in range(self.num_choices)]
        return _encode({**self.head, "choices": choices, "usage": usage.as_dict()})
