"""Tool calls forced by `tool_choice` (the grammar shapes the output; no tool parser needed):
a named function's arguments object, or `required`'s JSON array of {"name", "parameters"}."""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.parsers.tools.deltas import DeltaBuilder, new_call_id
from rill.asgi.parsers.tools.hermes import CallCounter
from rill.asgi.parsers.tools.json_call import CallScanner

_WS = " \t\r\n"


class NamedCall:
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: the whole output is that
    function's arguments. As OpenAI and vLLM do, the finish reason stays `stop` (called_tools is
    false): the client named the function, the model did not choose to call it."""

    called_tools = False

    def __init__(self, name: str, make_id: Callable[[], str] = new_call_id):
        self.name = name
        self.make_id = make_id
        self.opened = False

    def push(self, text: str) -> dict:
        delta = DeltaBuilder()
        if not self.opened:
            text = text.lstrip(_WS)
            if not text:
                return {}
            self._open(delta)
        delta.add_arguments(0, text)
        return delta.build()

    def finish(self) -> dict:
        delta = DeltaBuilder()
        if not self.opened:
            self._open(delta)
        return delta.build()

    def _open(self, delta: DeltaBuilder) -> None:
        self.opened = True
        delta.open_call(0, self.make_id(), self.name)


class RequiredCalls:
    """`tool_choice: "required"`: the output is `[{"name": ..., "parameters": {...}}, ...]`."""

    def __init__(self, make_id: Callable[[], str] = new_call_id):
        self.calls = CallCounter(make_id)
        self.state = "start"  # start: before "["; between: calls; done: after "]"
        self.pending = ""
        self.scanner: CallScanner | None = None

    @property
    def called_tools(self) -> bool:
        return self.calls.called_tools

    def push(self, text: str) -> dict:
        self.pending += text
        delta = DeltaBuilder()
        while self.pending and self.state != "done":
            if self.scanner is not None:
                used = self.scanner.feed(self.pending)
                self.pending = self.pending[used:]
                self.calls.send(self.scanner, delta)
                if self.scanner.closed:
                    self.scanner = None
                continue
            rest = self.pending.lstrip(_WS + ",")
            self.pending = rest[1:]
            if not rest:
                break
            if self.state == "start":
                self.state = "between" if rest[0] == "[" else "done"
            elif rest[0] == "]":
                self.state = "done"
            elif rest[0] == "{":
                self.scanner = CallScanner()
                self.pending = rest
        return delta.build()

    def finish(self) -> dict:
        delta = DeltaBuilder()
        if self.scanner is not None:
            self.scanner.finish()
            self.calls.send(self.scanner, delta)
            self.scanner = None
        return delta.build()
