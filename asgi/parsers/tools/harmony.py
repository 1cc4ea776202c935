"""vLLM's `openai` tool parser: GPT-OSS's harmony messages, which carry its reasoning, its answer and its calls.

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

Each message is a header (after `<|start|>`: the role, `<|channel|>` and its name, a recipient `to=...`, a
`<|constrain|>` type) up to `<|message|>`, then its body up to `<|end|>`, `<|call|>` or `<|return|>` (or the end
of the output: `<|call|>` and `<|return|>` are stop tokens). The recipient may come first, as the template writes
a past call back (`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`). The body of an
`analysis` message is reasoning; of a message to `functions.NAME`, a call of NAME whose arguments are the body as
written; of any other (`final`, a `commentary` preamble to the user) content. A message to another recipient (the built-in `browser` or `python`
tools, which Rill does not run) is content too.

The markers are special tokens: the text keeps them (reads_special_tokens). An output that does not open with
`<|channel|>`, `<|start|>` or `to=` is not harmony: all content. The parser does the reasoning part itself
(handles_reasoning), so it replaces a --reasoning-parser for the requests it parses; `--reasoning-parser
openai_gptoss` is the same parser for requests without tools. `strict` functions: the grammar of the whole output
(asgi/requests/harmony_calls.py).
"""
from __future__ import annotations

import re
from collections.abc import Callable

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.deltas import DeltaBuilder, held_tail, new_call_id

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
HEADS = (CHANNEL, START, "to=")  # how a message's header opens (the recipient first: the template's own order)
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


class HarmonyParser(BufferedParser):
    reads_special_tokens = True
    handles_reasoning = True

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.make_id = make_id
        self.num_calls = 0
        self.pending = ""
        self.state = "start"  # start: undecided; header; body; content: not harmony, all content
        self.kind = ""  # the body's: reasoning, content, call
        self.args_written = False  # the current call's

    @property
    def called_tools(self) -> bool:
        return self.num_calls > 0

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        while self.pending or final:
            if self.state == "start":
                head = self.pending.lstrip()
                if head.startswith(HEADS):
                    self.pending, self.state = head, "header"
                elif not final and any(h.startswith(head) for h in HEADS):
                    break  # nothing yet, or maybe a marker
                else:
                    self.state = "content"
            elif self.state == "content":
                delta.add_content(self.pending)
                self.pending = ""
                break
            elif self.state == "header":
                at = self.pending.find(MESSAGE)
                if at < 0:
                    if final:  # a header cut off: nothing of a message was written
                        self.pending = ""
                    break
                self._open(self.pending[:at], delta)
                self.pending, self.state = self.pending[at + len(MESSAGE):], "body"
            else:  # body
                found = [(i, end) for end in ENDS if (i := self.pending.find(end)) >= 0]
                at, end = min(found) if found else (-1, "")
                cut = at if at >= 0 else len(self.pending) - (0 if final else held_tail(self.pending, ENDS))
                self._write(self.pending[:cut], delta)
                self.pending = self.pending[cut:]
                if at < 0:
                    break
                self._close(delta)
                self.pending, self.state = self.pending[len(end):].lstrip(), "header"
            if final and not self.pending:
                break
        if final and self.state == "body":
            self._close(delta)
        return delta.build()

    def _close(self, delta: DeltaBuilder) -> None:
        if self.kind == "call" and not self.args_written:  # a call with an empty body: no arguments
            delta.add_arguments(self.num_calls - 1, "{}")
        self.kind, self.args_written = "", False

    def _open(self, header: str, delta: DeltaBuilder) -> None:
        channel = m.group(1) if (m := _CHANNEL.search(header)) else ""
        recipient = m.group(1) if (m := _RECIPIENT.search(header)) else ""
        if recipient.startswith("functions.") and len(recipient) > len("functions."):
            self.kind = "call"
            delta.open_call(self.num_calls, self.make_id(), recipient[len("functions."):])
            self.num_calls += 1
        else:
            self.kind = "reasoning" if channel == "analysis" else "content"

    def _write(self, text: str, delta: DeltaBuilder) -> None:
        if self.kind == "call":
            delta.add_arguments(self.num_calls - 1, text)
            self.args_written = self.args_written or bool(text)
        elif self.kind == "reasoning":
            delta.add_reasoning(text)
        else:
            delta.add_content(text)
