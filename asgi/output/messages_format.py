"""Anthropic's Message: one body, or its typed stream (message_start, content_block_start,
content_block_delta, content_block_stop, message_delta, message_stop). Text blocks only, in
this first slice of the Messages API."""
from __future__ import annotations

from typing import Any

import msgspec

from asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed, Usage
from asgi.output.responses_format import sse_event


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str | None:
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "stop":
        return "stop_sequence" if stop_sequence is not None else "end_turn"
    return None


def usage_of(usage: Usage) -> dict[str, int]:
    """Anthropic counts input tokens read from the cache apart; here they are part of the prompt."""
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0}


def error_event(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessageStream:
    """The Shape (asgi/output/respond.py) of a Message; its message_start goes out with the first
    token, like chat's role chunk."""

    ends_with_done = False
    opens_with_first_token = True

    def __init__(self, message_id: str, model: str) -> None:
        self.message_id = message_id
        self.model = model
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self._block_open = False

    def _message(self, gen: Generation, content: list[dict], reason: str | None, sequence: str | None) -> dict:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence, "usage": usage_of(gen.usage())}

    @staticmethod
    def _stop_sequence(gen: Generation) -> str | None:
        return gen.detokenizers[0].stop_matched

    def opening(self, gen: Generation) -> list[bytes]:
        return [sse_event({"type": "message_start", "message": self._message(gen, [], None, None)})]

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        out = []
        for delta in deltas:
            self.finish_reason = delta.finish_reason or self.finish_reason
            if not delta.text:
                continue
            if not self._block_open:
                self._block_open = True
                out.append(sse_event({"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": ""}}))
            out.append(sse_event({"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "text_delta", "text": delta.text}}))
        return out

    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]:
        return [sse_event(error_event(str(exc)))]

    def closing(self, gen: Generation) -> list[bytes] | None:
        if gen.disconnected:
            return None
        out = [sse_event({"type": "content_block_stop", "index": 0})] if self._block_open else []
        sequence = self._stop_sequence(gen)
        out.append(sse_event({"type": "message_delta",
                              "delta": {"stop_reason": stop_reason(self.finish_reason, sequence),
                                        "stop_sequence": sequence},
                              "usage": usage_of(gen.usage())}))
        out.append(sse_event({"type": "message_stop"}))
        return out

    def add(self, deltas: list[ChoiceDelta]) -> None:
        for delta in deltas:
            self.finish_reason = delta.finish_reason or self.finish_reason
            if delta.text:
                self.text.append(delta.text)

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        text = "".join(self.text)
        content = [{"type": "text", "text": text}] if text else []
        sequence = self._stop_sequence(gen)
        return msgspec.json.encode(self._message(gen, content, stop_reason(self.finish_reason, sequence), sequence))
