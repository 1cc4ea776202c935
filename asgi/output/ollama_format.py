"""Ollama's answer to /api/chat and /api/generate: newline-delimited JSON objects (`application/x-ndjson`), one a
piece of text (`message.content`, or `response`; `thinking` for the reasoning), then tool calls whole, then a last
object with `"done": true`, why it stopped and the durations in nanoseconds; or that last object, whole, as one body.
The text goes through chat's output parser, so reasoning and tool calls split as they do on /v1/chat/completions."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed
from rill.asgi.output.messages_blocks import tool_input
from rill.asgi.parsers.chat_output import OutputParser

NDJSON_HEADERS = [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache"),
                  (b"x-accel-buffering", b"no")]
_encode = msgspec.json.encode


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def line(obj: dict) -> bytes:
    return _encode(obj) + b"\n"


class OllamaAnswer:
    ends_with_done = False
    opens_with_first_token = True
    keepalive = b""  # NDJSON has no comments, and Ollama's clients parse every line: nothing is sent
    headers = NDJSON_HEADERS

    def __init__(self, model: str, parser: OutputParser, *, chat: bool, context: list[int] | None = None):
        self.model = model
        self.parser = parser
        self.chat = chat  # /api/chat's `message`, else /api/generate's `response`
        self.context = context  # /api/generate: the prompt's ids, then the output's, as `context`
        self.started = time.perf_counter_ns()
        self.first_token_at: int | None = None
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}  # the parser's index -> name, arguments so far
        self.finish_reason: str | None = None
        self.finished = False

    def _take(self, deltas: list[ChoiceDelta]) -> list[tuple[str, str]]:
        """(content, thinking) of each delta that brings text to show."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter_ns()
        pieces = []
        for delta in deltas:
            self.finish_reason = delta.finish_reason or self.finish_reason
            if self.context is not None and delta.token_ids:
                self.context += delta.token_ids
            pieces.append(self._parsed(self.parser.push(delta.text) if delta.text else {}))
            if delta.finish_reason is not None:
                pieces.append(self._finish())
        return [piece for piece in pieces if piece[0] or piece[1]]

    def _finish(self) -> tuple[str, str]:
        if self.finished:
            return "", ""
        self.finished = True
        return self._parsed(self.parser.finish())

    def _parsed(self, fields: dict) -> tuple[str, str]:
        for call in fields.get("tool_calls") or []:
            entry = self.calls.setdefault(call["index"], {"name": "", "arguments": ""})
            function = call.get("function") or {}
            entry["name"] = function.get("name") or entry["name"]
            entry["arguments"] += function.get("arguments") or ""
        content, thinking = fields.get("content") or "", fields.get("reasoning_content") or ""
        self.content.append(content)
        self.thinking.append(thinking)
        return content, thinking

    def _tool_calls(self) -> list[dict]:
        return [{"function": {"name": c["name"], "arguments": tool_input(c["arguments"])}}
                for _, c in sorted(self.calls.items())]

    def _piece(self, content: str, thinking: str, done: bool = False, calls: list[dict] | None = None) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            return {"model": self.model, "created_at": created_at(), "message": message, "done": done}
        piece = {"model": self.model, "created_at": created_at(), "response": content, "done": done}
        if thinking:
            piece["thinking"] = thinking
        return piece

    def _last(self, gen: Generation, content: str, thinking: str, calls: list[dict] | None) -> dict:
        usage, now = gen.usage(), time.perf_counter_ns()
        first = self.first_token_at or now
        last = {**self._piece(content, thinking, True, calls), "done_reason": "length" if
                self.finish_reason == "length" else "stop", "total_duration": now - self.started, "load_duration": 0,
                "prompt_eval_count": usage.prompt_tokens, "prompt_eval_duration": first - self.started,
                "eval_count": usage.completion_tokens, "eval_duration": now - first}
        if self.context is not None:
            last["context"] = self.context
        return last

    def opening(self, gen: Generation) -> list[bytes]:
        return []

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        return [line(self._piece(content, thinking)) for content, thinking in self._take(deltas)]

    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]:
        return [line({"error": str(exc)})]  # Ollama's clients raise it

    def closing(self, gen: Generation) -> list[bytes] | None:
        if gen.disconnected:
            return None
        lines = [line(self._piece(*piece)) for piece in [self._finish()] if piece[0] or piece[1]]
        if self.chat and self.calls:  # whole, as Ollama sends them: arguments an object
            lines.append(line(self._piece("", "", calls=self._tool_calls())))
        return [*lines, line(self._last(gen, "", "", None))]

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._take(deltas)

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        self._finish()
        calls = self._tool_calls() if self.chat and self.calls else None
        return _encode(self._last(gen, "".join(self.content), "".join(self.thinking), calls))
