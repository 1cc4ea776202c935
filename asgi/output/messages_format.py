"""Anthropic's Message: one body, or its typed stream (message_start, content_block_start,
content_block_delta, content_block_stop, message_delta, message_stop, and `ping` as the
keep-alive). The blocks themselves are asgi/output/messages_blocks.py's."""
from __future__ import annotations

from typing import Any

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed, Usage
from rill.asgi.output.messages_blocks import MessageBlocks
from rill.asgi.output.responses_format import sse_event

# Anthropic's keep-alive, written as Anthropic writes it.
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def stop_reason(finish_reason: str | None, stop_sequence: str | None, num_tool_uses: int) -> str | None:
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason in ("stop", "tool_calls"):
        if stop_sequence is not None:
            return "stop_sequence"
        return "tool_use" if num_tool_uses else "end_turn"
    return None


def usage_of(usage: Usage) -> dict[str, int]:
    """Anthropic counts input tokens read from the cache apart; here they are part of the prompt."""
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0}


def error_event(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessageStream:
    """The Shape (asgi/output/respond.py) of a Message; its message_start goes out with the first
    token, like chat's role chunk, and a `ping` event holds the connection until then."""

    ends_with_done = False
    opens_with_first_token = True
    keepalive = PING

    def __init__(self, message_id: str, model: str, blocks: MessageBlocks) -> None:
        self.message_id = message_id
        self.model = model
        self.blocks = blocks
        self.finish_reason: str | None = None

    def _message(self, gen: Generation, content: list[dict], reason: str | None, sequence: str | None) -> dict:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence, "usage": usage_of(gen.usage())}

    def _stop(self, gen: Generation) -> tuple[str | None, str | None]:
        """(stop_reason, stop_sequence)."""
        sequence = gen.detokenizers[0].stop_matched
        return stop_reason(self.finish_reason, sequence, self.blocks.num_tool_uses), sequence

    def opening(self, gen: Generation) -> list[bytes]:
        return [sse_event({"type": "message_start", "message": self._message(gen, [], None, None)})]

    def _push(self, deltas: list[ChoiceDelta]) -> list[dict]:
        events = []
        for delta in deltas:
            self.finish_reason = delta.finish_reason or self.finish_reason
            events += self.blocks.push(delta.text)
            if delta.finish_reason is not None:
                events += self.blocks.finish()
        return events

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        return [sse_event(event) for event in self._push(deltas)]

    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]:
        return [sse_event(error_event(str(exc)))]

    def closing(self, gen: Generation) -> list[bytes] | None:
        if gen.disconnected:
            return None
        events = self.blocks.finish()
        reason, sequence = self._stop(gen)
        events.append({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                       "usage": usage_of(gen.usage())})
        events.append({"type": "message_stop"})
        return [sse_event(event) for event in events]

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._push(deltas)  # the events are dropped: the body is the blocks

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        self.blocks.finish()
        return msgspec.json.encode(self._message(gen, self.blocks.content, *self._stop(gen)))
