"""vLLM's `deepseek_v3` and `deepseek_v31` tool parsers: DeepSeek's calls between special markers, one
block of them after any content:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "SF"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                                      (V3 and R1)

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "SF"}<｜tool▁call▁end｜>...  (V3.1)

Rules:
- text before the block is content, and so is text after it (vLLM streams it; its whole-text parse drops
  it); the whitespace around calls is handled as hermes does; text between calls is layout;
- a call opens once its name is complete (V3: at the newline after it; V3.1: at the separator); one whose
  name never completes was no call and is dropped;
- the arguments are passed on as written, less V3's ```json fence line and whatever whitespace (V3: and
  backticks, the closing fence) ends them; none at all are "{}";
- a call cut off by the end of the output, or by the end of the block, ends with the arguments that came.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from rill.asgi.parsers.tools.deltas import DeltaBuilder, held_tail, new_call_id
from rill.asgi.parsers.tools.hermes import ContentAroundCalls, StateParser

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_SPACE = " \t\r\n"
_FENCE = re.compile(r"```[^\n<]*\n")  # V3's "```json" line before the arguments
_FENCE_START = re.compile(r"`{0,3}|```[^\n<]*")  # what may still become that line


class DeepSeekV3Parser(StateParser):
    """V3 (and R1): `function<｜tool▁sep｜>NAME`, a newline, then the arguments in a ```json fence."""

    fenced = True
    calls_begin, calls_end, call_begin, call_end, sep = CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP
    call_tag = (CALL_BEGIN, CALL_BEGIN + "function" + SEP + "NAME\n```json\n", "\n```" + CALL_END)  # as HermesParser's

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.make_id = make_id
        self.num_calls = 0
        self.content = ContentAroundCalls()
        self.pending = ""
        self.state = "text"  # text, calls (in the block, between calls), type, name, fence, args
        self.name: list[str] = []
        self.sent_args = False  # some of the current call's arguments went out

    # -- states: each reads what it can of `pending` and says whether to go on -----------------

    def _at_text(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take((self.calls_begin,), final)
        self.content.add(text, delta)
        if tag:
            self.content.before_call_or_end(delta, self.num_calls)
            self.state = "calls"
        return tag is not None

    def _at_calls(self, delta: DeltaBuilder, final: bool) -> bool:
        _, tag = self._take((self.call_begin, self.calls_end), final)
        if tag == self.call_begin:
            self.name = []
            self.state = "type" if self.fenced else "name"
        elif tag:
            self.state = "text"
        return tag is not None

    def _at_type(self, delta: DeltaBuilder, final: bool) -> bool:
        _, tag = self._take((self.sep, self.call_end, self.calls_end), final)  # always "function"
        if tag == self.sep:
            self.state = "name"
        elif tag:
            self._after_call(tag)
        return tag is not None

    def _at_name(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take(("\n" if self.fenced else self.sep, self.call_end, self.calls_end), final)
        self.name.append(text)
        name = "".join(self.name).strip()
        if tag in (self.call_end, self.calls_end) or (tag and not name):
            self._after_call(tag)  # the name never completed: nothing went out, and nothing will
        elif tag:
            self.num_calls += 1
            delta.open_call(self.num_calls - 1, *self._named(name))
            self.sent_args = False
            self.state = "fence" if self.fenced else "args"
        return tag is not None

    def _at_fence(self, delta: DeltaBuilder, final: bool) -> bool:
        fence = _FENCE.match(self.pending)
        if fence:
            self.pending = self.pending[fence.end():]
        elif _FENCE_START.fullmatch(self.pending):
            if not final:
                return False
            self.pending = ""
        self.state = "args"
        return True

    def _at_args(self, delta: DeltaBuilder, final: bool) -> bool:
        at, tag = self._find((self.call_end, self.calls_end))
        if tag is None and not final:
            end = len(self.pending) - self._held_args()
            self._send_args(delta, self.pending[:end])
            self.pending = self.pending[end:]
            return False
        text, self.pending = self.pending[:at], self.pending[at + len(tag or ""):]
        text = text.rstrip(self._trailing)
        self._send_args(delta, text if text or self.sent_args else "{}")
        self._after_call(tag)
        return tag is not None

    # -- helpers ---------------------------------------------------------------------------------

    def _named(self, name: str) -> tuple[str, str]:
        """(the call's id, its function's name) from the name as written."""
        return self.make_id(), name

    def _held_args(self) -> int:
        """How much of the arguments' end to hold back: what may be the start of an end marker, and the
        whitespace (and in V3 the closing fence's backticks) before it, which the arguments lose if it ends
        them. The arguments sent so far then never end in what the end trims, so the pieces join into the
        arguments as the whole text gives them."""
        tag = held_tail(self.pending, (self.call_end, self.calls_end))
        rest = self.pending[:len(self.pending) - tag]
        return tag + len(rest) - len(rest.rstrip(self._trailing))

    @property
    def _trailing(self) -> str:
        """What the arguments lose at their end: whitespace, and in V3 the closing fence (or what came of it)."""
        return _SPACE + "`" if self.fenced else _SPACE

    def _send_args(self, delta: DeltaBuilder, text: str) -> None:
        if text:
            delta.add_arguments(self.num_calls - 1, text)
            self.sent_args = True

    def _after_call(self, tag: str | None) -> None:
        self.state = "text" if tag == self.calls_end else "calls"


class DeepSeekV31Parser(DeepSeekV3Parser):
    """V3.1: `NAME<｜tool▁sep｜>ARGUMENTS`, the arguments JSON as is."""

    fenced = False
    call_tag = (CALL_BEGIN, CALL_BEGIN + "NAME" + SEP, CALL_END)
