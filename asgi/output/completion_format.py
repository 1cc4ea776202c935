"""The completion's wire shapes: chunks of a stream, and the one body of a plain request."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Usage
from rill.asgi.output.chunk_format import ChunkFormatter
from rill.asgi.output.logprobs_format import CompletionLogprobs, merge_completion_logprobs, prompt_logprobs
from rill.asgi.output.token_text import TokenTexts

_encode = msgspec.json.encode


@dataclass
class Echo:
    """`echo`: each prompt's text opens its choices (choice i: prompt i // n), with its tokens'
    logprobs when `logprobs` is asked. `first_ids`: each prompt's first token id."""

    texts: list[str]
    first_ids: list[int]


@dataclass
class PromptScores:
    """vLLM's `prompt_logprobs` field, per choice in the non-streamed body."""

    texts: TokenTexts
    num_top: int


class CompletionFormatter(ChunkFormatter):
    """A choice's first delta carries its echoed prompt (text and logprobs), which therefore goes
    out with the first token, as the engine sends the prompt's logprobs then.

    A chunk's finish_reason is null until its choice ends, as OpenAI streams it; the spec (and so
    the SDK's strict mode) reuses the non-streamed schema, where it is not nullable.
    """

    def __init__(self, request_id: str, model: str, num_choices: int, include_usage: bool, *, n: int = 1,
                 echo: Echo | None = None, make_logprobs: Callable[[], CompletionLogprobs] | None = None,
                 prompt_scores: PromptScores | None = None, prompt_token_ids: list[list[int]] | None = None):
        """`prompt_token_ids`: vLLM's return_token_ids, each prompt's ids (choice i's: prompt i // n), which open
        the choice's first chunk beside the `token_ids` every chunk carries."""
        super().__init__(request_id, "text_completion", model, include_usage)
        self.num_choices = num_choices
        self.n = n
        self.echo = echo
        self.opened = [False] * num_choices
        self.logprobs = [make_logprobs() for _ in range(num_choices)] if make_logprobs else None
        self.prompt_scores = prompt_scores
        self.prompt_token_ids = prompt_token_ids
        # The non-streamed answer, built by add().
        self._token_ids: list[list[int]] = [[] for _ in range(num_choices)]
        self._texts: list[list[str]] = [[] for _ in range(num_choices)]
        self._logprobs: list[dict] = [{"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                                      for _ in range(num_choices)]
        self._prompt_logprobs: list[list | None] = [None] * num_choices
        self._finish_reasons: list[str | None] = [None] * num_choices

    def opening_chunks(self, usage: Usage | None = None) -> list[bytes]:
        return []

    def _choices(self, deltas: list[ChoiceDelta]) -> list[dict]:
        return [self._choice(d) for d in deltas]

    def _choice(self, d: ChoiceDelta) -> dict:
        i, text = d.index, d.text
        logprobs = None if self.logprobs is None else self.logprobs[i]
        piece = None
        opening = not self.opened[i]
        if opening:
            self.opened[i] = True
            if self.echo is not None:
                text = self.echo.texts[i // self.n] + text
                if logprobs is not None:
                    piece = logprobs.prompt_piece(self.echo.first_ids[i // self.n], d.prompt_logprobs)
            if self.prompt_scores is not None:
                scores = self.prompt_scores
                self._prompt_logprobs[i] = prompt_logprobs(scores.texts, d.prompt_logprobs, scores.num_top)
        if logprobs is not None:
            generated = logprobs.piece(d.logprobs)
            if piece is None:
                piece = generated
            else:
                merge_completion_logprobs(piece, generated)
        choice = {"index": i, "text": text, "logprobs": piece, "finish_reason": d.finish_reason}
        if self.prompt_token_ids is not None:
            if opening:
                choice["prompt_token_ids"] = self.prompt_token_ids[i // self.n]
            choice["token_ids"] = d.token_ids or []
        return choice

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
            self._token_ids[i].extend(choice.get("token_ids", ()))

    def body(self, usage: Usage) -> bytes:
        choices = []
        for i in range(self.num_choices):
            choice = {"index": i, "text": "".join(self._texts[i]),
                      "logprobs": None if self.logprobs is None else self._logprobs[i],
                      "finish_reason": self._finish_reasons[i]}
            if self.prompt_scores is not None:
                choice["prompt_logprobs"] = self._prompt_logprobs[i]
            if self.prompt_token_ids is not None:
                choice["prompt_token_ids"] = self.prompt_token_ids[i // self.n]
                choice["token_ids"] = self._token_ids[i]
            choices.append(choice)
        return _encode({**self.head, "choices": choices, "usage": usage.as_dict()})
