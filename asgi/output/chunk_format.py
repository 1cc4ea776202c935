"""What the chat and completions formatters share: each chunk's head and usage field, chunks without choices."""
from __future__ import annotations

import time

import msgspec

from rill.asgi.engine_link.generate import Usage

_encode = msgspec.json.encode


class ChunkFormatter:
    def __init__(self, request_id: str, obj: str, model: str, include_usage: bool):
        self.head = {"id": request_id, "object": obj, "created": int(time.time()), "model": model}
        self.include_usage = include_usage

    def _chunk(self, choices: list[dict], usage: Usage | None, **fields) -> bytes:
        body = {**self.head, "choices": choices, **fields}
        if usage is not None:  # stream_options.continuous_usage_stats: the usage so far
            body["usage"] = usage.as_dict()
        elif self.include_usage:
            body["usage"] = None
        return _encode(body)

    def choiceless_chunk(self, **fields) -> bytes:
        """A chunk with `choices: []` and these fields (the usage chunk, nvext's fields)."""
        return _encode({**self.head, "choices": [], **fields})

    def usage_chunk(self, usage: Usage) -> bytes:
        return self.choiceless_chunk(usage=usage.as_dict())
