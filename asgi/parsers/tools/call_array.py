"""A JSON array of calls read as it streams in: `[{"name": ..., "arguments": {...}}, ...]`, the form
Mistral's older tokenizers write after `[TOOL_CALLS]` and Granite after `<|tool_call|>` or `<tool_call>`.

Each item is read with CallScanner, so a call's arguments stream as written; as in vLLM, an item
without arguments is not a call. Items may be separated by commas and whitespace. The text that turns
out not to be calls is handed back as content: all of it (marker included) while no call has gone out;
after a call, from the first item that is not one.
"""
from __future__ import annotations

from rill.asgi.parsers.tools.deltas import DeltaBuilder
from rill.asgi.parsers.tools.hermes import CallCounter
from rill.asgi.parsers.tools.json_call import CallScanner

_WS = " \t\r\n"


class CallArray:
    """Feed it the text after the marker; once `done`, `leftover` is the text that was not calls, and the
    text `feed` did not use is the parser's again (what follows the array, or the rest of a broken one)."""

    def __init__(self, calls: CallCounter, written: str = ""):
        self.calls = calls
        self.unsent = [written]  # content unless a call follows: the marker, then the items' text
        self.expect = "["  # then "item": an object, a comma or "]"
        self.scanner: CallScanner | None = None
        self.called = False  # a call of this array went out
        self.done = False

    @property
    def leftover(self) -> str:
        return "".join(self.unsent)

    def feed(self, text: str, delta: DeltaBuilder) -> int:
        """Read what it can of `text`; returns how many characters were used."""
        i = 0
        while i < len(text) and not self.done:
            if self.scanner is not None:
                i += self._feed_item(text[i:], delta)
                continue
            c = text[i]
            if self.expect == "item" and c == "{":
                self.scanner = CallScanner(require_args=True)
                continue
            if self.expect == "[" and c == "[":
                self.expect = "item"
            elif self.expect == "item" and c == "]":
                self.done = True
            elif not (c in _WS or self.expect == "item" and c == ","):
                self.done = True  # not an array of calls: this character is the parser's again
                break
            if not self.called:  # separators after a call are the array's, never content
                self.unsent.append(c)
            i += 1
        return i

    def read(self, text: str, delta: DeltaBuilder, final: bool) -> int:
        """`feed`, and at the end of the output (`final`) `finish` an array still open; how many characters were
        used (the parser's caller goes on once `done`)."""
        used = self.feed(text, delta)
        if final and not self.done:
            self.finish(delta)
        return used

    def finish(self, delta: DeltaBuilder) -> None:
        """The text ended inside the array: a cut-off call goes out as far as written (its name, and
        its arguments so far); a cut-off item that is not a call yet is left over."""
        if self.scanner is not None:
            self.scanner.finish()
            self._send(delta, "")
        self.done = True

    def _feed_item(self, text: str, delta: DeltaBuilder) -> int:
        used = self.scanner.feed(text)
        self._send(delta, text[:used])
        if self.scanner.closed:
            self.done = not self.scanner.named  # an object that is not a call ends the reading
            self.scanner = None
        return used

    def _send(self, delta: DeltaBuilder, read: str) -> None:
        self.calls.send(self.scanner, delta)
        if self.scanner.named:  # the item is a call: what was held for it is not content
            self.unsent.clear()
            self.called = True
        else:
            self.unsent.append(read)
