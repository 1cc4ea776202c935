"""The chat completion's wire shapes: chunks of a stream, and the one body of a plain request.

Each choice's text goes through its own OutputParser (asgi/parsers/chat_output.py); what it returns is
the choice's streamed `delta`, and the non-streamed `message` is the same deltas merged.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Usage
from rill.asgi.output.chat_delta import merge_delta, message
from rill.asgi.output.chunk_format import ChunkFormatter
from rill.asgi.output.logprobs_format import ChatLogprobs, prompt_logprobs
from rill.asgi.output.token_text import TokenTexts
from rill.asgi.parsers.chat_output import OutputParser, PlainText

_encode = msgspec.json.encode


class ChatFormatter(ChunkFormatter):
    def __init__(self, request_id: str, model: str, num_choices: int, include_usage: bool, *,
                 make_parser: Callable[[], OutputParser] = PlainText, logprobs: ChatLogprobs | None = None,
                 prompt_scores: tuple[TokenTexts, int] | None = None, prompt_token_ids: list[int] | None = None,
                 echo: str = ""):
        """`prompt_token_ids`: vLLM's return_token_ids, the prompt's ids, in the stream's first chunk and the
        body; each choice's `token_ids` ride on its chunks (those its parser held back on the next one sent).
        `echo`: vLLM's chat echo, the text each choice's content opens with (in the stream's first chunks)."""
        super().__init__(request_id, "chat.completion.chunk", model, include_usage)
        self.num_choices = num_choices
        self.logprobs = logprobs  # None: the request did not ask for logprobs
        self.parsers = [make_parser() for _ in range(num_choices)]
        # The non-streamed answer, built by add(): merged delta fields, logprobs, finish per choice.
        self.echo = echo
        self._merged: list[dict] = [{"content": echo} if echo else {} for _ in range(num_choices)]
        self._logprobs: list[list[dict]] = [[] for _ in range(num_choices)]
        self._finish_reasons: list[str | None] = [None] * num_choices
        # vLLM's `prompt_logprobs` (texts, top k): one list in the body, the choices sharing the prompt.
        self.prompt_scores = prompt_scores
        self._prompt_logprobs: list | None = None
        self.prompt_token_ids = prompt_token_ids
        ids = prompt_token_ids is not None
        self._pending_ids: list[list[int]] | None = [[] for _ in range(num_choices)] if ids else None
        self._token_ids: list[list[int]] = [[] for _ in range(num_choices)]
        self.keep_whole = False  # chunks() merges too: a streamed completion to store (asgi/routes/stored_chats.py)

    def opening_chunks(self, usage: Usage | None = None) -> list[bytes]:
        first = {} if self.prompt_token_ids is None else {"prompt_token_ids": self.prompt_token_ids}
        return [self._chunk([{"index": i, "delta": {"role": "assistant", "content": self.echo}, "logprobs": None,
                              "finish_reason": None}], usage, **(first if i == 0 else {}))
                for i in range(self.num_choices)]

    def chunks(self, deltas: list[ChoiceDelta], usage: Usage | None = None) -> list[bytes]:
        """One chunk per choice, as OpenAI and vLLM stream n > 1; none for a choice whose parser
        held its text back when there is nothing else to send. With `keep_whole` (a stream to store), each is
        merged too, as add() does, for body() to give the whole completion at the end."""
        choices = self._choices(deltas)
        if self.keep_whole:
            self._merge(choices)
        return [self._chunk([choice], usage) for choice in choices]

    def add(self, deltas: list[ChoiceDelta]) -> None:
        """For the non-streamed body: the same choice pieces a stream would send, merged."""
        self._merge(self._choices(deltas))

    def _merge(self, choices: list[dict]) -> None:
        for choice in choices:
            i = choice["index"]
            merge_delta(self._merged[i], choice["delta"])
            if choice["logprobs"] is not None:
                self._logprobs[i].extend(choice["logprobs"]["content"])
            self._finish_reasons[i] = choice["finish_reason"] or self._finish_reasons[i]
            self._token_ids[i].extend(choice.get("token_ids", ()))

    def _choices(self, deltas: list[ChoiceDelta]) -> list[dict]:
        out = []
        for d in deltas:
            if self.prompt_scores is not None and self._prompt_logprobs is None:
                texts, num_top = self.prompt_scores
                self._prompt_logprobs = prompt_logprobs(texts, d.prompt_logprobs, num_top)
            if self._pending_ids is not None and d.token_ids:
                self._pending_ids[d.index].extend(d.token_ids)
            parser = self.parsers[d.index]
            fields = parser.push(d.text) if d.text else {}
            finish = d.finish_reason
            if finish is not None:
                fields = merge_delta(merge_delta({}, fields), parser.finish())
                if finish == "stop" and parser.called_tools:
                    finish = "tool_calls"
            logprobs = None if self.logprobs is None else self.logprobs.content(d.logprobs)
            if not fields and not logprobs and finish is None:
                continue
            choice = {"index": d.index, "delta": fields,
                      "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                      "finish_reason": finish}
            if self._pending_ids is not None:
                choice["token_ids"], self._pending_ids[d.index] = self._pending_ids[d.index], []
            out.append(choice)
        return out

    def body(self, usage: Usage) -> bytes:
        return _encode(self.whole(usage))

    def whole(self, usage: Usage) -> dict:
        """The non-streamed answer as an object (body()'s, before it is encoded)."""
        choices = [{"index": i, "message": message(self._merged[i]),
                    "logprobs": None if self.logprobs is None else {"content": self._logprobs[i], "refusal": None},
                    "finish_reason": self._finish_reasons[i]} for i in range(self.num_choices)]
        if self.prompt_token_ids is not None:
            for i, choice in enumerate(choices):
                choice["token_ids"] = self._token_ids[i]
        body = {**self.head, "object": "chat.completion", "choices": choices, "usage": usage.as_dict()}
        if self.prompt_token_ids is not None:
            body["prompt_token_ids"] = self.prompt_token_ids
        if self.prompt_scores is not None:
            body["prompt_logprobs"] = self._prompt_logprobs
        return body
