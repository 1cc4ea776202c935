"""vLLM's `hunyuan_a13b` tool parser: Hunyuan-A13B's calls, a JSON array in tags after any text,

    Let me check.<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>

The text before `<tool_calls>` is content; the array is read by CallArray (each call's arguments streamed as
written; an item without arguments is not a call, and an array that is not one of calls is content, tags included);
`</tool_calls>` is dropped, and the text after it is content.
"""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.parsers.tools.call_array import CallArray
from rill.asgi.parsers.tools.deltas import DeltaBuilder, held_tail, new_call_id
from rill.asgi.parsers.tools.granite import GraniteParser

OPEN, CLOSE = "<tool_calls>", "</tool_calls>"


class HunyuanParser(GraniteParser):
    """Granite's counter, content and array, after any text."""

    reads_special_tokens = False
    call_arrays = ((OPEN, CLOSE),)

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        super().__init__(make_id, tools)
        self.state = "text"  # text; array (after <tool_calls>); close (after the array: its tag expected)

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        while True:
            if self.state == "text":
                at = self.pending.find(OPEN)
                end = at if at >= 0 else len(self.pending) - (0 if final else held_tail(self.pending, (OPEN,)))
                self.content.add(self.pending[:end], delta)
                self.pending = self.pending[end:]
                if at < 0:
                    break
                self.content.before_call_or_end(delta, self.calls.num_calls)
                self.array = CallArray(self.calls, OPEN)
                self.pending, self.state = self.pending[len(OPEN):], "array"
            if self.state == "array":
                self.pending = self.pending[self.array.read(self.pending, delta, final):]
                if not self.array.done:
                    return delta.build()
                self.content.add(self.array.leftover, delta)
                self.state = "close" if self.array.called else "text"
            if self.state == "close":
                head = self.pending.lstrip()
                if head.startswith(CLOSE):
                    self.pending, self.state = head[len(CLOSE):], "text"
                elif not final and CLOSE.startswith(head):
                    return delta.build()
                else:
                    self.state = "text"
        if final:
            self.content.before_call_or_end(delta, self.calls.num_calls)
        return delta.build()
