"""A Message's content blocks (`thinking`, `text`, `tool_use`), built from chat's parsed output.

The chat path's OutputParser (asgi/parsers/chat_parsing.py) splits the generated text into
reasoning, content and tool calls; each becomes a block in the order the model wrote them, and
each change is one of Anthropic's stream events (content_block_start, content_block_delta,
content_block_stop). The non-streamed Message holds the same blocks, so the events of a stream
always rebuild it, with one exception that Anthropic's API has too: a tool call cut short by
max_tokens streams the JSON the model wrote, while the whole Message gives an `input` that is
not a JSON object as `{}`.
"""
from __future__ import annotations

import uuid
from typing import Any

from rill.asgi.parsers.chat_output import OutputParser
from rill.asgi.requests import nesting

# This server cannot sign thinking; Anthropic's SDKs require the field, so it is empty.
SIGNATURE = ""


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def tool_input(arguments: str) -> dict[str, Any]:
    """The tool call's arguments as the `input` object; {} if they are not one (a cut-short call)."""
    try:
        value = nesting.loads(arguments) if arguments.strip() else {}
    except ValueError:  # TooDeep too: the model's text, which must not become a RecursionError
        return {}
    return value if isinstance(value, dict) else {}


class MessageBlocks:
    """The blocks of one Message. `push` and `finish` return the stream events of what changed."""

    def __init__(self, parser: OutputParser):
        self.parser = parser  # disable_parallel_tool_use: it leaves out later calls (chat_parsing.FirstCalls)
        self.content: list[dict[str, Any]] = []  # the blocks as the Message has them
        self._open: dict[str, Any] | None = None  # the block being written (the last of `content`)
        self._arguments = ""  # the open tool_use block's JSON text
        self._call_index: int | None = None  # the parser's index of the open tool_use's call
        self.finished = False

    @property
    def num_tool_uses(self) -> int:
        return sum(1 for block in self.content if block["type"] == "tool_use")

    def push(self, text: str) -> list[dict]:
        return self._on(self.parser.push(text)) if text else []

    def finish(self) -> list[dict]:
        """What the parser held back, then the last block's stop (once)."""
        if self.finished:
            return []
        self.finished = True
        return self._on(self.parser.finish()) + self._close()

    def _on(self, fields: dict) -> list[dict]:
        events: list[dict] = []
        if reasoning := fields.get("reasoning_content"):
            events += self._append("thinking", reasoning)
        if content := fields.get("content"):
            events += self._append("text", content)
        for call in fields.get("tool_calls") or []:
            events += self._tool_call(call)
        return events

    def _index(self) -> int:
        return len(self.content) - 1

    def _start(self, block: dict[str, Any], start_block: dict[str, Any]) -> list[dict]:
        events = self._close()
        self.content.append(block)
        self._open = block
        return events + [{"type": "content_block_start", "index": self._index(), "content_block": start_block}]

    def _append(self, kind: str, text: str) -> list[dict]:
        """Text of a `text` or `thinking` block (its field has the block type's name)."""
        events = []
        if self._open is None or self._open["type"] != kind:
            empty = {"type": kind, kind: "", **({"signature": SIGNATURE} if kind == "thinking" else {})}
            events = self._start(dict(empty), empty)
        self._open[kind] += text
        delta = {"type": "text_delta", "text": text} if kind == "text" else {"type": "thinking_delta", "thinking": text}
        return events + [{"type": "content_block_delta", "index": self._index(), "delta": delta}]

    def _tool_call(self, call: dict) -> list[dict]:
        index = call["index"]
        events = []
        if self._open is None or self._open["type"] != "tool_use" or self._call_index != index:
            name = (call.get("function") or {}).get("name") or ""
            block = {"type": "tool_use", "id": new_tool_use_id(), "name": name, "input": {}}
            events = self._start(block, dict(block, input={}))
            self._call_index, self._arguments = index, ""
        if pieces := (call.get("function") or {}).get("arguments"):
            self._arguments += pieces
            events.append({"type": "content_block_delta", "index": self._index(),
                           "delta": {"type": "input_json_delta", "partial_json": pieces}})
        return events

    def _close(self) -> list[dict]:
        block, self._open = self._open, None
        if block is None:
            return []
        events = []
        if block["type"] == "tool_use":
            block["input"] = tool_input(self._arguments)
            self._call_index, self._arguments = None, ""
        elif block["type"] == "thinking":
            events.append({"type": "content_block_delta", "index": self._index(),
                           "delta": {"type": "signature_delta", "signature": block["signature"]}})
        return events + [{"type": "content_block_stop", "index": self._index()}]
