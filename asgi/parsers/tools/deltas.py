"""Building the chat `delta` dicts that OutputParsers return (asgi/parsers/chat_output.py); merging them is asgi/output/chat_delta.py."""
from __future__ import annotations

import uuid


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def held_tail(text: str, tags: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could be the start of one of `tags`: they are
    held back until the next piece of text tells whether a tag begins there."""
    longest = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:n]):
                longest = n
                break
    return longest


class DeltaBuilder:
    """Collects one push's content, reasoning and tool-call pieces into one delta dict."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict] = []  # one entry per call index, in order

    def add_content(self, text: str) -> None:
        if text:
            self.content.append(text)

    def add_reasoning(self, text: str) -> None:
        if text:
            self.reasoning.append(text)

    def open_call(self, index: int, call_id: str, name: str) -> None:
        """A call's first piece: its id, type and name (arguments follow in later pieces)."""
        self.calls.append({"index": index, "id": call_id, "type": "function",
                           "function": {"name": name, "arguments": ""}})

    def add_arguments(self, index: int, text: str) -> None:
        if not text:
            return
        if self.calls and self.calls[-1]["index"] == index:
            self.calls[-1]["function"]["arguments"] += text
        else:
            self.calls.append({"index": index, "function": {"arguments": text}})

    def build(self) -> dict:
        delta: dict = {}
        if self.reasoning:
            delta["reasoning_content"] = "".join(self.reasoning)
        if self.content:
            delta["content"] = "".join(self.content)
        if self.calls:
            delta["tool_calls"] = self.calls
        return delta
