"""vLLM's `granite` tool parser: a JSON array of calls, `[{"name": ..., "arguments": {...}}, ...]`, after
`<|tool_call|>` (Granite 3.0, a special token) or `<tool_call>` (Granite 3.1+), read by CallArray.

As in vLLM, only an output that begins (after whitespace) with one of the markers or with `[` is read as
calls; anything else is all content, as written. Text after the array is content.
"""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.call_array import CallArray
from rill.asgi.parsers.tools.deltas import DeltaBuilder, new_call_id
from rill.asgi.parsers.tools.hermes import CallCounter, ContentAroundCalls

MARKERS = ("<|tool_call|>", "<tool_call>")


class GraniteParser(BufferedParser):
    reads_special_tokens = True  # Granite 3.0's <|tool_call|>
    markers = MARKERS
    call_arrays = tuple((m, "") for m in MARKERS)  # a strict call's (requests/strict_calls.py): (marker, end)

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.calls = CallCounter(make_id)
        self.content = ContentAroundCalls()
        self.pending = ""
        self.state = "start"  # start: undecided; array; content: everything left is content
        self.array: CallArray | None = None

    @property
    def called_tools(self) -> bool:
        return self.calls.called_tools

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        if self.state == "start":
            head = self.pending.lstrip()
            marker = next((m for m in self.markers if head.startswith(m)), "")
            if marker or head.startswith("["):
                at = len(self.pending) - len(head) + len(marker)
                self.array = CallArray(self.calls, self.pending[:at])
                self.pending, self.state = self.pending[at:], "array"
            elif not final and any(m.startswith(head) for m in self.markers):  # nothing yet, or maybe a marker
                return {}
            else:
                self.state = "content"
        if self.state == "array":
            self.pending = self.pending[self.array.read(self.pending, delta, final):]
            if not self.array.done:
                return delta.build()
            self.pending, self.state = self.array.leftover + self.pending, "content"
        if self.calls.called_tools:  # whitespace after the calls is dropped
            self.content.add(self.pending, delta)
            if final:
                self.content.before_call_or_end(delta, self.calls.num_calls)
        else:
            delta.add_content(self.pending)
        self.pending = ""
        return delta.build()


class Phi4MiniJsonParser(GraniteParser):
    """vLLM's `phi4_mini_json`: Phi-4-mini's `functools[{"name": ..., "arguments": {...}}, ...]`, read the same way
    (an output that begins with `functools` or `[`)."""

    reads_special_tokens = False
    markers = ("functools",)
    call_arrays = (("functools", ""),)
