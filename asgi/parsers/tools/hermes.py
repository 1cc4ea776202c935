"""vLLM's `hermes` tool parser: calls written as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(Hermes 2 Pro, Qwen 2.5 and 3, and most models trained on that format)."""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.deltas import DeltaBuilder, held_tail, new_call_id
from rill.asgi.parsers.tools.json_call import CallScanner

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class CallCounter:
    """Numbers the calls of one choice and turns a CallScanner's pieces into delta pieces."""

    def __init__(self, make_id: Callable[[], str]):
        self.make_id = make_id
        self.num_calls = 0

    @property
    def called_tools(self) -> bool:
        return self.num_calls > 0

    def send(self, scanner: CallScanner, delta: DeltaBuilder) -> None:
        for kind, text in scanner.pieces:
            if kind == "name":
                self.num_calls += 1
                delta.open_call(self.num_calls - 1, self.make_id(), text)
            else:
                delta.add_arguments(self.num_calls - 1, text)
        scanner.pieces.clear()


class ContentAroundCalls:
    """Text outside calls is content as written, except whitespace that only separates calls
    (or follows the last one): held back, and dropped unless more text follows."""

    def __init__(self) -> None:
        self.held = ""
        self.sent_text = False

    def add(self, text: str, delta: DeltaBuilder) -> None:
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body):]
        if body:
            delta.add_content(body)
            self.sent_text = True

    def before_call_or_end(self, delta: DeltaBuilder, num_calls: int) -> None:
        if self.held and self.sent_text and num_calls == 0:
            delta.add_content(self.held)  # "Let me look.\n" before the first call keeps its newline
        self.held = ""


class StateParser(BufferedParser):
    """A parser written as states (qwen3_coder.py, deepseek_v3.py): `_drain` runs `_at_<state>` until one says
    to stop (False), then at the end settles the whitespace held before calls. Subclasses keep `content` (a
    ContentAroundCalls), `num_calls` and `state`."""

    content: ContentAroundCalls
    num_calls: int
    state: str
    close: str  # a call's closing tag

    pending: str

    @property
    def called_tools(self) -> bool:
        return self.num_calls > 0

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        while getattr(self, "_at_" + self.state)(delta, final):
            pass
        if final:
            self.content.before_call_or_end(delta, self.num_calls)
        return delta.build()

    def _find(self, tags: tuple[str, ...]) -> tuple[int, str | None]:
        """Where the first of `tags` begins in `pending`, and which ((len(pending), None) for none)."""
        return min(((at, tag) for tag in tags if (at := self.pending.find(tag)) >= 0),
                   default=(len(self.pending), None))

    def _at_not_call(self, delta: DeltaBuilder, final: bool) -> bool:
        """An opening tag that opened no call: its text is content as written, up to its `close` tag."""
        text, tag = self._take((self.close,), final)
        self.content.add(text + (tag or ""), delta)
        if tag:
            self.state = "text"
        return tag is not None

    def _take(self, tags: tuple[str, ...], final: bool) -> tuple[str, str | None]:
        """Removes from `pending` the text before the first of `tags`, and that tag; with none of them,
        all the text that cannot be the start of one (all of it when final)."""
        at, tag = self._find(tags)
        if tag is None and not final:
            at -= held_tail(self.pending, tags)
        text, self.pending = self.pending[:at], self.pending[at + len(tag or ""):]
        return text, tag


class HermesParser(BufferedParser):
    # (trigger, the call's text before its arguments, after them): the grammar of `strict` functions
    # (asgi/requests/structural_tags.py); NAME stands for the function's name.
    call_tag = (OPEN, OPEN + '\n{"name": "NAME", "arguments": ', "}\n" + CLOSE)

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.calls = CallCounter(make_id)
        self.content = ContentAroundCalls()
        self.pending = ""
        self.scanner: CallScanner | None = None  # inside <tool_call> when set
        self.body: list[str] = []  # the current call's text as written

    @property
    def called_tools(self) -> bool:
        return self.calls.called_tools

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        while True:
            tag = CLOSE if self.scanner else OPEN
            at = self.pending.find(tag)
            end = at if at >= 0 else len(self.pending) - (0 if final else held_tail(self.pending, (tag,)))
            text, self.pending = self.pending[:end], self.pending[end:]
            if self.scanner is None:
                self.content.add(text, delta)
                if at < 0:
                    if final:
                        self.content.before_call_or_end(delta, self.calls.num_calls)
                    break
                self.content.before_call_or_end(delta, self.calls.num_calls)
                self.pending = self.pending[len(OPEN):]
                self.scanner = CallScanner()
                self.body = []
            else:
                self.body.append(text)
                self.scanner.feed(text)
                self.calls.send(self.scanner, delta)
                if at < 0 and not final:
                    break
                if at >= 0:
                    self.pending = self.pending[len(CLOSE):]
                self._end_call(delta, closed=at >= 0)
                if at < 0:
                    break
        return delta.build()

    def _end_call(self, delta: DeltaBuilder, closed: bool) -> None:
        scanner, self.scanner = self.scanner, None
        scanner.finish()
        self.calls.send(scanner, delta)
        if not scanner.named:  # not a call after all: the model's text, tags included, is content
            self.content.add(OPEN + "".join(self.body) + (CLOSE if closed else ""), delta)
