"""vLLM's `mistral` tool parser: calls after Mistral's `[TOOL_CALLS]` marker, in one of two forms.

- A JSON array of calls, `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (the v3 tokenizer:
  Mistral 7B v0.3, Nemo), read by CallArray.
- A name and its arguments object, `[TOOL_CALLS]f[ARGS]{...}`, the marker again before each further call
  (tokenizer v11+: Mistral Small 3.2, Magistral, Devstral). Some versions write `[CALL_ID]` and an id
  between the name and `[ARGS]`: accepted and dropped, the call gets our own id like every other.
  The arguments are passed on as written, piece by piece, up to the brace that closes the object.

What follows the marker decides the form: `[` the array, else a name. Text before the first marker and
between calls is content; a marker followed by anything else than a call stays content as written.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.call_array import CallArray
from rill.asgi.parsers.tools.deltas import DeltaBuilder, held_tail, new_call_id
from rill.asgi.parsers.tools.hermes import CallCounter, ContentAroundCalls

MARKER, CALL_ID, ARGS = "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"
_NAME = re.compile(r"\s*([A-Za-z0-9_-]*)")  # OpenAI's function-name characters
_ID = re.compile(r"[A-Za-z0-9]*")
_WS = re.compile(r"\s*")


def call_head(text: str) -> tuple[str, int] | bool:
    """The text after a marker read as `name[CALL_ID]id[ARGS]{`: (name, where the `{` is) once all
    of that is there; True while more text may still make it so; False when it cannot."""
    match = _NAME.match(text)
    name, i = match.group(1), match.end()
    if i == len(text):
        return True
    if not name:
        return False
    if text.startswith(CALL_ID, i):
        i = _ID.match(text, i + len(CALL_ID)).end()
    elif CALL_ID.startswith(text[i:]):
        return True
    if not text.startswith(ARGS, i):
        return ARGS.startswith(text[i:])
    i = _WS.match(text, i + len(ARGS)).end()
    if i == len(text):
        return True
    return (name, i) if text[i] == "{" else False


class ObjectEnd:
    """Finds where a JSON object ends as its text streams in: braces counted outside strings."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.closed = False

    def feed(self, text: str) -> int:
        """Consume text up to the object's closing brace; returns how many characters were used."""
        for i, c in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c == "{":
                self.depth += 1
            elif c == "}":
                self.depth -= 1
                if self.depth == 0:
                    self.closed = True
                    return i + 1
        return len(text)


class MistralParser(BufferedParser):
    call_tag = (MARKER, MARKER + "NAME" + ARGS, "")  # as HermesParser's (the v11+ form)

    reads_special_tokens = True  # [TOOL_CALLS], [CALL_ID] and [ARGS] are special tokens

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.calls = CallCounter(make_id)
        self.content = ContentAroundCalls()
        self.pending = ""
        # text: content until a marker; marker: `pending` begins with one; args: in a name-form call's
        # arguments; array: in the array form
        self.state = "text"
        self.args: ObjectEnd | None = None
        self.array: CallArray | None = None

    @property
    def called_tools(self) -> bool:
        return self.calls.called_tools

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        while self._step(final, delta):
            pass
        return delta.build()

    def _step(self, final: bool, delta: DeltaBuilder) -> bool:
        """Read what `pending` allows in the current state; False once it needs more text."""
        if self.state == "text":
            at = self.pending.find(MARKER)
            end = at if at >= 0 else len(self.pending) - (0 if final else held_tail(self.pending, (MARKER,)))
            self.content.add(self.pending[:end], delta)
            self.pending = self.pending[end:]
            if at < 0:
                if final:
                    self.content.before_call_or_end(delta, self.calls.num_calls)
                return False
            self.content.before_call_or_end(delta, self.calls.num_calls)
            self.state = "marker"
        elif self.state == "marker":
            rest = self.pending[len(MARKER):]
            if rest.lstrip().startswith("["):
                self.array, self.pending, self.state = CallArray(self.calls, MARKER), rest, "array"
                return True
            head = call_head(rest)
            if head is True and not final:
                return False
            if isinstance(head, tuple):
                name, at = head
                self.calls.num_calls += 1
                delta.open_call(self.calls.num_calls - 1, self.calls.make_id(), name)
                self.pending, self.args, self.state = rest[at:], ObjectEnd(), "args"
            else:  # not a call: the marker is the model's text
                self.content.add(MARKER, delta)
                self.pending, self.state = rest, "text"
        elif self.state == "args":
            used = self.args.feed(self.pending)
            # A call cut off inside its arguments keeps them as far as written (not valid JSON).
            delta.add_arguments(self.calls.num_calls - 1, self.pending[:used])
            self.pending = self.pending[used:]
            if not self.args.closed:
                return False
            self.state = "text"
        else:
            self.pending = self.pending[self.array.read(self.pending, delta, final):]
            if not self.array.done:
                return False
            self.content.add(self.array.leftover, delta)
            self.state = "text"
        return True
