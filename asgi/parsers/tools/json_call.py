"""One tool call written as a JSON object, read as it streams in: `{"name": ..., "arguments": {...}}`.

The arguments object is passed on as the model wrote it, piece by piece, so streamed pieces
always join into the same arguments as the whole text gives; its name is sent once known.
"""
from __future__ import annotations

import json

_WS = " \t\r\n"


class CallScanner:
    """Feed it the text of one JSON object; `pieces` collects ("name", name) once the call's
    name is known and its arguments begin, then ("arguments", text) pieces.

    args_keys: the keys whose value is the arguments ("arguments" and vLLM's "parameters").
    require_args: without an arguments key the object is not a call (Llama 3's JSON form, where
    a plain JSON answer must stay content); else a call with no arguments gets "{}".
    """

    def __init__(self, args_keys: tuple[str, ...] = ("arguments", "parameters"), require_args: bool = False):
        self.args_keys = args_keys
        self.require_args = require_args
        self.pieces: list[tuple[str, str]] = []
        self.started = False
        self.closed = False
        self.not_json = False  # something other than an object began
        self.name: str | None = None
        self.named = False  # the ("name", ...) piece went out: this object is a call
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._expect = "key"  # at depth 1: key, colon, value, literal, comma
        self._key: list[str] = []
        self._is_key = False
        self._value: list[str] | None = None  # the depth-1 value being read, when it is kept
        self._value_key: str | None = None
        self._args: list[str] = []  # arguments text not sent yet
        self._args_seen = False
        self._args_kind = ""  # "container": streamed as is; else converted once complete

    def feed(self, text: str) -> int:
        """Consume text up to the object's closing brace; returns how many characters were used."""
        for i, c in enumerate(text):
            if self.closed or self.not_json:
                return i
            self._step(c)
        if self.named:
            self._flush_args()
        return len(text)

    def finish(self) -> None:
        """The text ended (the object may be unterminated): send what a call still owes."""
        if self._value is not None and self._value_key in self.args_keys and self._args_kind != "container":
            self._end_args("".join(self._value))
        if self.name is not None and not self.named and (self._args_seen or not self.require_args):
            self._send_name()
            if not self._args_seen:
                self.pieces.append(("arguments", "{}"))
        if self.named:
            self._flush_args()

    # -- internals -----------------------------------------------------------------------

    def _step(self, c: str) -> None:
        if self._in_string:
            self._keep(c)
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                if self._depth == 1:
                    self._end_top_string()
            return
        if self._depth == 0:
            if c == "{":
                self.started = True
                self._depth = 1
            elif c not in _WS:
                self.not_json = True
            return
        if self._depth == 1:
            self._step_top(c)
            return
        self._keep(c)
        if c == '"':
            self._in_string = True
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
            if self._depth == 1:
                self._end_value()

    def _step_top(self, c: str) -> None:
        expect = self._expect
        if expect == "key":
            if c == '"':
                self._in_string, self._is_key, self._key = True, True, [c]
            elif c == "}":
                self._close()
        elif expect == "colon":
            if c == ":":
                self._expect = "value"
        elif expect == "value":
            if c in _WS:
                return
            self._value_key = self._current_key
            self._value = [] if self._value_key in self.args_keys or self._value_key == "name" else None
            if self._value_key in self.args_keys and not self._args_seen:
                self._args_seen = True
                self._args_kind = "container" if c in "{[" else "other"
                if self._args_kind == "container" and self.name is not None:
                    self._send_name()
            elif self._value_key in self.args_keys:
                self._value = None  # a second arguments key: the first one counts
            self._keep(c)
            if c == '"':
                self._in_string, self._is_key = True, False
                self._expect = "string"
            elif c in "{[":
                self._depth += 1
                self._expect = "container"
            else:
                self._expect = "literal"
        elif expect == "literal":
            if c in ",}":
                self._end_value()
                if c == "}":
                    self._close()
            else:
                self._keep(c)
        elif expect == "comma":
            if c == ",":
                self._expect = "key"
            elif c == "}":
                self._close()

    def _keep(self, c: str) -> None:
        if self._in_string and self._is_key and self._depth == 1:
            self._key.append(c)
        elif self._value is not None:
            self._value.append(c)
            if self._args_kind == "container" and self._value_key in self.args_keys:
                self._args.append(c)

    def _end_top_string(self) -> None:
        if self._is_key:
            self._is_key = False
            try:
                self._current_key = json.loads("".join(self._key))
            except ValueError:
                self._current_key = None
            self._expect = "colon"
        else:
            self._end_value()

    def _end_value(self) -> None:
        value, key = self._value, self._value_key
        self._value, self._value_key, self._expect = None, None, "comma"
        if value is None:
            return
        text = "".join(value)
        if key == "name":
            try:
                name = json.loads(text)
            except ValueError:
                return
            if isinstance(name, str) and self.name is None:
                self.name = name
                if self._args_seen:
                    self._send_name()
        elif key in self.args_keys:
            if self._args_kind != "container":
                self._end_args(text)
            self._args_kind = "done"

    def _end_args(self, text: str) -> None:
        """Arguments that are not an object: a JSON string holding the arguments' JSON (as
        OpenAI writes them) is unwrapped; null is {}; anything else passes as written."""
        text = text.rstrip(_WS)
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if value is None:
            text = "{}"
        elif isinstance(value, str) and text.startswith('"'):
            text = value
        self._args = [text]
        self._args_kind = "done"
        if self.named:
            self._flush_args()
        elif self.name is not None:
            self._send_name()

    def _close(self) -> None:
        self.closed = True
        self._depth = 0
        self.finish()

    def _send_name(self) -> None:
        self.named = True
        self.pieces.append(("name", self.name))
        self._flush_args()

    def _flush_args(self) -> None:
        if self._args:
            self.pieces.append(("arguments", "".join(self._args)))
            self._args.clear()

    _current_key: str | None = None
