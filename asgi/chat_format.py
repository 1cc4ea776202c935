"""The chat completion's wire shapes: chunks of a stream, and the one body of a plain request."""
from __future__ import annotations

import time

import msgspec

from asgi.generate import ChoiceDelta, Usage

_encode = msgspec.json.encode


class ChatFormatter:
    def __init__(self, request_id: str, model: str, num_choices: int, include_usage: bool):
        self.head = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": model}
        self.num_choices = num_choices
        self.include_usage = include_usage

    def _chunk(self, choices: list[dict]) -> bytes:
        body = {**self.head, "choices": choices}
        if self.include_usage:
            body["usage"] = None
        return _encode(body)

    def opening_chunks(self) -> list[bytes]:
        return [self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}]) for i in range(self.num_choices)]

    def chunk(self, deltas: list[ChoiceDelta]) -> bytes:
        return self._chunk([{"index": d.index, "delta": {"content": d.text} if d.text else {}, "logprobs": None,
                             "finish_reason": d.finish_reason} for d in deltas])

    def usage_chunk(self, usage: Usage) -> bytes:
        return _encode({**self.head, "choices": [], "usage": usage.as_dict()})

    def body(self, texts: list[str], finish_reasons: list[str | None], usage: Usage) -> bytes:
        choices = [{"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None, "finish_reason": finish_reasons[i]} for i, text in enumerate(texts)]
        return _encode({**self.head, "object": "chat.completion", "choices": choices, "usage": usage.as_dict()})
