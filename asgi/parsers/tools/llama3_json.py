"""vLLM's `llama3_json` tool parser: Llama 3.1+'s JSON calls `{"name": ..., "parameters": {...}}`,
after an optional `<|python_tag|>`, several separated by `;`.

As in vLLM, only an output that begins with the tag or with `{` is read as calls; anything
else is all content. A JSON object that is not a call (no name or no parameters) is content.
"""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.deltas import DeltaBuilder, new_call_id
from rill.asgi.parsers.tools.hermes import CallCounter
from rill.asgi.parsers.tools.json_call import CallScanner

PYTHON_TAG = "<|python_tag|>"
_SEPARATORS = " \t\r\n;"


class Llama3JsonParser(BufferedParser):
    call_tag = ('{"name": "', '{"name": "NAME", "parameters": ', "}")  # as HermesParser's

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.calls = CallCounter(make_id)
        self.mode = "start"  # start: undecided; calls; content: everything left is content
        self.pending = ""
        self.scanner: CallScanner | None = None
        self.body: list[str] = []

    @property
    def called_tools(self) -> bool:
        return self.calls.called_tools

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        while True:
            if self.mode == "start":
                head = self.pending.lstrip()
                if head.startswith(PYTHON_TAG) or head.startswith("{"):
                    self.pending = head.removeprefix(PYTHON_TAG)
                    self.mode = "calls"
                elif not final and PYTHON_TAG.startswith(head):  # nothing yet, or maybe the tag
                    break
                else:
                    self.mode = "content"
            elif self.mode == "content":
                delta.add_content(self.pending)
                self.pending = ""
                break
            elif self.scanner is None:
                rest = self.pending.lstrip(_SEPARATORS)
                self.pending = rest
                if not rest:
                    break
                if rest[0] != "{":
                    self.mode = "content"
                    continue
                self.scanner, self.body = CallScanner(require_args=True), []
            else:
                used = self.scanner.feed(self.pending)
                self.body.append(self.pending[:used])
                self.pending = self.pending[used:]
                self.calls.send(self.scanner, delta)
                if not self.scanner.closed:
                    break
                self._end_call(delta)
        if final and self.scanner is not None:
            self._end_call(delta)
        return delta.build()

    def _end_call(self, delta: DeltaBuilder) -> None:
        scanner, self.scanner = self.scanner, None
        scanner.finish()
        self.calls.send(scanner, delta)
        if not scanner.named:
            delta.add_content("".join(self.body))
            self.mode = "content"
