"""vLLM's `qwen3_coder` tool parser: Qwen3-Coder's XML calls (also Qwen3.5's and Qwen3-Next's).

    <tool_call>
    <function=get_weather>
    <parameter=city>
    San Francisco
    </parameter>
    </function>
    </tool_call>

Rules, as vLLM's:
- a value loses one leading and one trailing newline, nothing else; it ends at `</parameter>`, or, where the
  model left that out, at the next `<parameter=`, `</function>` or `</tool_call>`;
- each value is typed by its property in the request's tools (`convert`); the arguments are the values'
  json.dumps object, streamed as the parameters complete: `{` with the name, each `"key": value` at its
  `</parameter>`, `}` at `</function>`;
- a `<function=...>` block without the `<tool_call>` tags is a call too; a `<tool_call>` whose body does not
  begin with `<function=NAME>` is content as written, up to its `</tool_call>`;
- a call cut off by the end of the output is closed with the parameters it has (an unclosed value as it stands).
Text outside calls is content, with the whitespace around calls handled as hermes does.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable

from rill.asgi.parsers.tools.deltas import DeltaBuilder, new_call_id
from rill.asgi.parsers.tools.hermes import ContentAroundCalls, StateParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_NAME_END = re.compile(r"[>\n<]")  # a newline or a `<` before the `>` means `<function=` began no tag
_NOT = object()  # a value that does not read as the type asked for


class Qwen3CoderParser(StateParser):
    open, close = OPEN, CLOSE
    function, function_end, parameter, parameter_end = FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END
    # A strict call as Qwen3-Coder's template writes one, its parameters in xgrammar's "qwen_xml" style
    # (requests/strict_calls.py)
    call_tag = (OPEN, f"{OPEN}\n{FUNCTION}NAME>\n", f"{FUNCTION_END}\n{CLOSE}")
    call_style = "qwen_xml"

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.make_id = make_id
        self.tools = tools
        self.num_calls = 0
        self.content = ContentAroundCalls()
        self.pending = ""
        self.state = "text"  # text, head (after <tool_call>), name, params, key, value, not_call
        self.wrapped = False  # inside a <tool_call> whose </tool_call> has not come yet
        self.raw: list[str] = []  # a call's tags as written, until its name is known
        self.properties: dict = {}  # the current function's parameter schemas
        self.num_params = 0
        self.key = ""
        self.value: list[str] = []

    # -- states: each reads what it can of `pending` and says whether to go on -----------------

    def _at_text(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take((self.open, self.function, self.close) if self.wrapped else (self.open, self.function), final)
        self.content.add(text, delta)
        if tag == self.close:  # the </tool_call> after a </function>: the layout before it is no content either
            self.content.before_call_or_end(delta, self.num_calls)
            self.wrapped = False
        elif tag:
            self.content.before_call_or_end(delta, self.num_calls)
            self.raw = [tag]
            self.wrapped = self.wrapped or tag == self.open
            self.state = "head" if tag == self.open else "name"
        return tag is not None

    def _at_head(self, delta: DeltaBuilder, final: bool) -> bool:
        body = self.pending.lstrip()
        if body.startswith(self.function):
            self.raw.append(self.pending[:len(self.pending) - len(body) + len(self.function)])
            self.pending = body[len(self.function):]
            self.state = "name"
        elif not final and self.function.startswith(body):
            return False
        else:
            self._not_a_call(delta)
        return True

    def _at_name(self, delta: DeltaBuilder, final: bool) -> bool:
        end = _NAME_END.search(self.pending)
        if end is None and not final:
            return False
        name = self._unquoted(self.pending[:end.start()]) if end and end.group() == ">" else ""
        if not name:
            self._not_a_call(delta)
            return True
        self.pending = self.pending[end.end():]
        self.num_calls += 1
        delta.open_call(self.num_calls - 1, self.make_id(), name)
        delta.add_arguments(self.num_calls - 1, "{")
        self.properties = tool_properties(self.tools, name)
        self.num_params = 0
        self.state = "params"
        return True

    def _at_params(self, delta: DeltaBuilder, final: bool) -> bool:
        _, tag = self._take(self._ends(self.parameter), final)  # text between parameters is layout
        if tag == self.parameter:
            self.state = "key"
        elif tag or final:
            self._end_call(delta, tag)
        return tag is not None

    def _at_key(self, delta: DeltaBuilder, final: bool) -> bool:
        at = self.pending.find(">")
        if at < 0:
            if final:  # cut off inside `<parameter=...`: that parameter never began
                self.pending = ""
                self._end_call(delta, None)
            return False
        self.key = self._unquoted(self.pending[:at])
        self.pending = self.pending[at + 1:]
        self.value = []
        self.state = "value"
        return True

    def _at_value(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take(self._ends(self.parameter_end, self.parameter), final)
        self.value.append(text)
        if tag is None and not final:
            return False
        self._end_parameter(delta)
        if tag == self.parameter:
            self.state = "key"
        elif tag == self.parameter_end:
            self.state = "params"
        else:
            self._end_call(delta, tag)
        return tag is not None

    # -- helpers ---------------------------------------------------------------------------------

    def _ends(self, *tags: str) -> tuple[str, ...]:
        """`tags` and the tags that end the current function."""
        return (*tags, self.function_end, self.close) if self.wrapped else (*tags, self.function_end)

    @staticmethod
    def _unquoted(name: str) -> str:
        return name.strip()

    @staticmethod
    def _value(text: str) -> str:
        return text.removeprefix("\n").removesuffix("\n")

    def _not_a_call(self, delta: DeltaBuilder) -> None:
        """The tags read so far began no call: they are content as written, up to the `</tool_call>`
        if there was a `<tool_call>`."""
        self.content.add("".join(self.raw), delta)
        self.state = "not_call" if self.wrapped else "text"
        self.wrapped = False

    def _end_parameter(self, delta: DeltaBuilder) -> None:
        piece = typed_argument(self.key, self._value("".join(self.value)), self.properties, first=not self.num_params)
        delta.add_arguments(self.num_calls - 1, piece)
        self.num_params += 1

    def _end_call(self, delta: DeltaBuilder, tag: str | None) -> None:
        delta.add_arguments(self.num_calls - 1, "}")
        self.state = "text"
        if tag == self.close:
            self.wrapped = False


def tool_properties(tools: list[dict] | None, name: str) -> dict:
    """The parameter schemas of the request's function `name` ({} when it has none or is not there)."""
    for tool in tools or ():
        function = tool.get("function") or {}
        if function.get("name") == name:
            return (function.get("parameters") or {}).get("properties") or {}
    return {}


def typed_argument(key: str, text: str, properties: dict, first: bool) -> str:
    """One argument of a call's JSON object: `"key": value`, the value typed by its property's schema (`convert`),
    after ", " unless `first`: json.dumps' own separators, so that the pieces join into json.dumps of the object."""
    typed = convert(text, properties.get(key))
    return ("" if first else ", ") + json.dumps(key, ensure_ascii=False) + ": " + json.dumps(typed, ensure_ascii=False)


def convert(text: str, schema: object) -> object:
    """A parameter's value as its schema's `type` reads it: "string" keeps the text; "integer" and "number"
    take a JSON number of that kind, "boolean" true or false in any case, "object" and "array" any JSON;
    "null" (for any type but "string") is null. Text that does not read as its type stays a string.
    Without a schema or a known type, JSON other than a string is kept as that value, else the text.
    (vLLM also reads Python literals, such as {'a': 1} or None: here they stay strings.)"""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = kinds if isinstance(kinds, list) else [kinds]
    for kind in sorted(kinds, key=lambda kind: kind == "string"):  # a union tries "string" last
        value = _as(kind, text)
        if value is not _NOT:
            return value
    return text


def _as(kind: object, text: str) -> object:
    if kind == "string":
        return text
    word = text.strip().lower()
    if kind == "boolean" and word in ("true", "false"):
        return word == "true"
    value = _json(text)
    if value is None:
        return None
    if kind == "integer":
        fits = type(value) is int
    elif kind == "number":
        fits = type(value) in (int, float)
    elif kind in ("object", "array"):
        fits = value is not _NOT
    elif kind in ("boolean", "null"):
        fits = False
    else:
        fits = value is not _NOT and not isinstance(value, str)
    return value if fits else _NOT


def _json(text: str) -> object:
    try:
        value = json.loads(text)
        json.dumps(value, allow_nan=False)  # NaN, Infinity and numbers too big for a float are no JSON to send
    except (ValueError, RecursionError):
        return _NOT
    return value
