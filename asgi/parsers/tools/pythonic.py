"""vLLM's `pythonic` tool parser: the output is a Python list of calls, `[get_weather(city="Paris"), get_time()]`
(Llama 3.2, Llama 4 and others), optionally wrapped in Llama 4's `<|python_start|>` ... `<|python_end|>`.

As in vLLM, only an output that begins (after whitespace) with `[` or `<|python_start|>` is read as calls;
anything else is all content. A call is a plain name with keyword arguments whose values are Python literals
(strings, numbers, True/False/None, lists, tuples, dicts, nested), turned into a JSON object; positional
arguments or any other value make it not a call. Each call goes out whole once its closing `)` arrives.
Text is held while it may still be a list of calls: if it turns out not to be (`[1, 2]`, a markdown link),
it is all content as written; after a call, the text from the first item that is not a call is content.
Text after the closing `]` (and a `<|python_end|>`) is content.
"""
from __future__ import annotations

import ast
import json
from collections.abc import Callable

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.deltas import DeltaBuilder, new_call_id
from rill.asgi.parsers.tools.hermes import ContentAroundCalls

START, END = "<|python_start|>", "<|python_end|>"
_WS = " \t\r\n"


def call_arguments(text: str) -> tuple[str, str] | None:
    """(name, arguments as JSON) of one call written `name(key=literal, ...)`; None when it is not one."""
    try:
        call = ast.parse(text, mode="eval").body
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
            return None
        if any(keyword.arg is None for keyword in call.keywords):  # **kwargs
            return None
        arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}
        # allow_nan: 1e999 is a literal (inf) that JSON cannot write; sets, bytes and complex raise TypeError.
        return call.func.id, json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None


class PythonicParser(BufferedParser):
    arguments_of = staticmethod(call_arguments)  # a call's (name, arguments as JSON), or None

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.make_id = make_id
        self.num_calls = 0
        self.content = ContentAroundCalls()
        self.pending = ""  # the text since the last call (all of it before the first)
        self.pos = 0  # how far `pending` has been read
        # start: undecided; open: "[" next; item: a call or "]"; after: "," or "]"; name, args: in a call;
        # end: after "]"; content: everything left is content
        self.state = "start"
        self.call_start = 0
        self.depth = 0  # brackets open in the call, its "(" included
        self.quote = ""  # the open string's quotes: ' " ''' or """
        self.escape = False

    @property
    def called_tools(self) -> bool:
        return self.num_calls > 0

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        while self.state != "content" and self._step(final, delta):
            pass
        if self.state == "content":
            if self.num_calls:  # whitespace after the calls is dropped
                self.content.add(self.pending, delta)
                if final:
                    self.content.before_call_or_end(delta, self.num_calls)
            else:
                delta.add_content(self.pending)
            self.pending = ""
        return delta.build()

    def _step(self, final: bool, delta: DeltaBuilder) -> bool:
        """Read what `pending` allows in the current state; False once it needs more text."""
        if self.state == "start":
            return self._start(final)
        if self.state in ("open", "item", "after"):
            return self._between(final)
        if self.state == "name":
            return self._name(final)
        if self.state == "args":
            return self._args(final, delta)
        return self._end(final)

    def _start(self, final: bool) -> bool:
        head = self.pending.lstrip()
        if head.startswith(START) or head.startswith("["):
            self.pos = len(self.pending) - len(head) + (len(START) if head.startswith(START) else 0)
            self.state = "open"
        elif not final and START.startswith(head):  # nothing yet, or maybe the tag
            return False
        else:
            self.state = "content"
        return True

    def _between(self, final: bool) -> bool:
        """Outside calls, in or before the list: whitespace, then what the state expects."""
        text, i = self.pending, self.pos
        while i < len(text) and text[i] in _WS:
            i += 1
        self.pos = i
        if i == len(text):
            if final:  # cut off between items: nothing more is a call
                self._not_calls(i)
            return False
        c = text[i]
        if self.state == "open" and c == "[" or self.state == "after" and c == ",":
            self.state, self.pos = "item", i + 1
        elif self.state == "item" and c.isidentifier():
            self.state, self.call_start = "name", i
        elif self.state in ("item", "after") and c == "]" and self.num_calls:
            self.state, self.pos = "end", i + 1
        else:
            self._not_calls(i)
        return True

    def _name(self, final: bool) -> bool:
        text, i = self.pending, self.pos
        while i < len(text) and (text[i].isalnum() or text[i] == "_"):
            i += 1
        self.pos = i
        if i == len(text):
            if final:
                self._not_calls(self.call_start)
            return False
        if text[i] == "(":
            self.state, self.pos, self.depth = "args", i + 1, 1
        else:
            self._not_calls(self.call_start)
        return True

    def _args(self, final: bool, delta: DeltaBuilder) -> bool:
        end = self._call_end()
        if end is None:
            if final:  # a call cut off before its ")" is content, as written
                self._not_calls(self.call_start)
            return False
        call = self.arguments_of(self.pending[self.call_start:end])
        if call is None:
            self._not_calls(self.call_start)
            return True
        delta.open_call(self.num_calls, self.make_id(), call[0])
        delta.add_arguments(self.num_calls, call[1])
        self.num_calls += 1
        self.state, self.pending, self.pos = "after", self.pending[end:], 0
        return True

    def _end(self, final: bool) -> bool:
        """After the list's "]": a <|python_end|> is dropped, what follows is content."""
        rest = self.pending[self.pos:]
        head = rest.lstrip()
        if head.startswith(END):
            rest = head[len(END):]
        elif not final and END.startswith(head):  # nothing yet, or maybe the tag
            return False
        self.state, self.pending = "content", rest
        return True

    def _call_end(self) -> int | None:
        """Where the call's closing ")" ends, reading on from `pos`; None while it has not come."""
        text, i = self.pending, self.pos
        while i < len(text):
            c = text[i]
            if self.quote:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif text.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = ""
                    continue
                elif c == self.quote[0] and self.quote.startswith(text[i:]):
                    break  # perhaps a triple quote's end, cut: wait for the rest
            elif c in "'\"":
                if text.startswith(c * 3, i):
                    self.quote = c * 3
                    i += 3
                    continue
                if (c * 3).startswith(text[i:]):
                    break  # "" at the end: an empty string, or a triple quote to come
                self.quote = c
            elif c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth -= 1
                if self.depth == 0:
                    self.pos = i + 1
                    return i + 1
            i += 1
        self.pos = i
        return None

    def _not_calls(self, at: int) -> None:
        """The text is not (or no longer) a list of calls from `at` on: it is content from there, or all
        of it while no call has gone out."""
        self.state, self.pending = "content", self.pending[at if self.num_calls else 0:]
