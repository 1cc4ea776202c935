"""vLLM's `gemma4` tool parser: Gemma 4's calls, each between its special markers, one after another:

    Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

The name follows `call:`; the arguments, from `{` to the call's end marker, are Gemma 4's own syntax
(gemma4_args.py), sent as their JSON once the call ends (a call cut off by the end of the output with what it has).
A `<|tool_call>` without `call:NAME{` is content as written, up to its end marker. Text outside calls is content,
with the whitespace around calls handled as hermes does. The markers are special tokens: the text keeps them
(reads_special_tokens), as vLLM's does.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable

from rill.asgi.parsers.tools.deltas import DeltaBuilder, new_call_id
from rill.asgi.parsers.tools.gemma4_args import read_arguments
from rill.asgi.parsers.tools.hermes import ContentAroundCalls, StateParser

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
_HEADER = re.compile(r"\s*call:([\w.\-]+)\s*\{")
_HEADER_SO_FAR = re.compile(r"\s*(c(a(l(l(:[\w.\-]*\s*)?)?)?)?)?")  # what may still become one


class Gemma4Parser(StateParser):
    reads_special_tokens = True
    close = CLOSE
    # A strict call (requests/strict_calls.py): its arguments in xgrammar's "gemma" style, braces included
    call_tag = (OPEN, f"{OPEN}call:NAME", CLOSE)
    call_style = "gemma"

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.make_id = make_id
        self.num_calls = 0
        self.content = ContentAroundCalls()
        self.pending = ""
        self.state = "text"  # text, header (after <|tool_call>), args (after `call:NAME{`), not_call
        self.args: list[str] = []

    def _at_text(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take((OPEN,), final)
        self.content.add(text, delta)
        if tag:
            self.content.before_call_or_end(delta, self.num_calls)
            self.state = "header"
        return tag is not None

    def _at_header(self, delta: DeltaBuilder, final: bool) -> bool:
        if (m := _HEADER.match(self.pending)) is not None:
            self.num_calls += 1
            delta.open_call(self.num_calls - 1, self.make_id(), m.group(1))
            self.pending, self.args, self.state = self.pending[m.end():], ["{"], "args"
            return True
        if not final and CLOSE not in self.pending and _HEADER_SO_FAR.fullmatch(self.pending):
            return False  # maybe the header, still coming
        self.content.add(OPEN, delta)  # not a call: its text is content as written
        self.state = "not_call"
        return True

    def _at_args(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take((CLOSE,), final)
        self.args.append(text)
        if tag is None and not final:
            return False
        arguments = read_arguments("".join(self.args))
        delta.add_arguments(self.num_calls - 1, json.dumps(arguments if isinstance(arguments, dict) else {},
                                                           ensure_ascii=False))
        self.state = "text"
        return tag is not None
