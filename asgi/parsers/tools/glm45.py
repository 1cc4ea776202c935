"""vLLM's `glm45` (and `glm47`) tool parser: GLM-4.5's, 4.6's and 4.7's calls, each argument a key and a value:

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>

Rules, as vLLM's:
- the name is the text after `<tool_call>` up to a newline or the first `<arg_key>` (leading newlines skipped);
  a `<tool_call>` with no name is content as written, up to its `</tool_call>`;
- each value is typed by its property in the request's tools (qwen3_coder's `convert`: a `string` keeps its text
  as written, numbers, booleans, objects and arrays are read as JSON); the arguments are the values' json.dumps
  object, streamed as the values close: `{` with the name, each `"key": value` at its `</arg_value>`, `}` at
  `</tool_call>`; a key with no value is left out, and so is the text between pairs;
- a call cut off by the end of the output is closed with the arguments it has (an unclosed value as it stands).
Text outside calls is content, with the whitespace around calls handled as hermes does. The tags are added tokens
that GLM's tokenizers may count as special: the text keeps special tokens (reads_special_tokens), as vLLM's does.
"""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.parsers.tools.deltas import DeltaBuilder, new_call_id
from rill.asgi.parsers.tools.hermes import ContentAroundCalls, StateParser
from rill.asgi.parsers.tools.qwen3_coder import tool_properties, typed_argument

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


class Glm45Parser(StateParser):
    reads_special_tokens = True
    close = CLOSE
    # A strict call, its arguments in xgrammar's "glm_xml" style, which takes GLM-4.5's newline after the name or
    # GLM-4.7's none
    call_tag = (OPEN, f"{OPEN}NAME", CLOSE)
    call_style = "glm_xml"

    def __init__(self, make_id: Callable[[], str] = new_call_id, tools: list[dict] | None = None):
        self.make_id = make_id
        self.tools = tools
        self.num_calls = 0
        self.content = ContentAroundCalls()
        self.pending = ""
        self.state = "text"  # text, name, not_call, params, key, between (a key and its value), value
        self.name: list[str] = []
        self.properties: dict = {}  # the current function's parameter schemas
        self.num_params = 0
        self.key: list[str] = []
        self.value: list[str] = []

    # -- states: each reads what it can of `pending` and says whether to go on -----------------

    def _at_text(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take((OPEN,), final)
        self.content.add(text, delta)
        if tag:
            self.content.before_call_or_end(delta, self.num_calls)
            self.name = []
            self.state = "name"
        return tag is not None

    def _at_name(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take(("\n", KEY, CLOSE), final)
        self.name.append(text)
        name = "".join(self.name).strip()
        if tag is None and not final:
            return False
        if tag == "\n" and not name:
            self.name.append(tag)  # a newline before the name
            return True
        if not name:  # no call: its tags are content as written
            self.content.add(OPEN + "".join(self.name) + (tag or ""), delta)
            self.state = "not_call" if tag == KEY else "text"
            return tag is not None
        self.num_calls += 1
        delta.open_call(self.num_calls - 1, self.make_id(), name)
        delta.add_arguments(self.num_calls - 1, "{")
        self.properties = tool_properties(self.tools, name)
        self.num_params = 0
        self.key, self.state = [], "key" if tag == KEY else "params"
        if tag in (CLOSE, None):
            self._end_call(delta)
        return tag is not None

    def _at_params(self, delta: DeltaBuilder, final: bool) -> bool:
        _, tag = self._take((KEY, CLOSE), final)  # text between pairs is layout
        if tag == KEY:
            self.key, self.state = [], "key"
        elif tag or final:
            self._end_call(delta)
        return tag is not None

    def _at_key(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take((KEY_END, CLOSE), final)
        self.key.append(text)
        if tag == KEY_END:
            self.state = "between"
        elif tag or final:  # a key cut off: no argument
            self._end_call(delta)
        return tag is not None

    def _at_between(self, delta: DeltaBuilder, final: bool) -> bool:
        _, tag = self._take((VALUE, KEY, CLOSE), final)
        if tag == VALUE:
            self.value, self.state = [], "value"
        elif tag == KEY:  # a key without a value: left out
            self.key, self.state = [], "key"
        elif tag or final:
            self._end_call(delta)
        return tag is not None

    def _at_value(self, delta: DeltaBuilder, final: bool) -> bool:
        text, tag = self._take((VALUE_END, CLOSE), final)
        self.value.append(text)
        if tag is None and not final:
            return False
        piece = typed_argument("".join(self.key).strip(), "".join(self.value), self.properties, first=not self.num_params)
        delta.add_arguments(self.num_calls - 1, piece)
        self.num_params += 1
        if tag == VALUE_END:
            self.state = "params"
        else:
            self._end_call(delta)
        return tag is not None

    def _end_call(self, delta: DeltaBuilder) -> None:
        delta.add_arguments(self.num_calls - 1, "}")
        self.state = "text"
