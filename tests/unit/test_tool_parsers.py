"""Tool-call parsers as pure units: hermes, llama3_json and the forced (named, required) calls."""
from __future__ import annotations

import json

import pytest

from rill.asgi.parsers.tools import TOOL_PARSERS
from rill.asgi.parsers.tools.forced import NamedCall, RequiredCalls
from rill.asgi.parsers.tools.hermes import HermesParser
from rill.asgi.parsers.tools.llama3_json import Llama3JsonParser
from tests.helpers.parser_checks import check_every_split, run

WEATHER = {"city": "Paris", "units": ["C", {"nested": "}]\"{"}], "n": -1.5e3, "ok": True}


def calls(message: dict) -> list[tuple[str, object]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"] or []]


def test_registry_has_vllm_names():
    assert TOOL_PARSERS["hermes"] is HermesParser and TOOL_PARSERS["llama3_json"] is Llama3JsonParser


def test_hermes_content_then_two_calls():
    text = ("Let me check.\n<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": WEATHER})
            + "\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"get_time\"}\n</tool_call>\n")
    message = check_every_split(HermesParser, text)
    assert message["content"] == "Let me check.\n"
    assert calls(message) == [("get_weather", WEATHER), ("get_time", {})]
    # The arguments are passed on as the model wrote them.
    assert message["tool_calls"][0]["function"]["arguments"] == json.dumps(WEATHER)
    assert run(HermesParser, text)[1] is True


def test_hermes_plain_text_is_untouched():
    for text in ("Hello there!\n", "a < b and <tool is not a tag>", "  x  ", "", "<tool_cal"):
        message = check_every_split(HermesParser, text)
        assert message["content"] == (text or None) and message["tool_calls"] is None
        assert run(HermesParser, text)[1] is False


def test_hermes_text_between_and_after_calls():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n\n'
            'and then <tool_call>{"name": "b", "arguments": {}}</tool_call>  \n')
    message = check_every_split(HermesParser, text)
    assert message["content"] == "\n\nand then" and calls(message) == [("a", {"x": 1}), ("b", {})]


def test_hermes_unparseable_call_stays_content():
    text = "Sure <tool_call>not json</tool_call> done"
    message = check_every_split(HermesParser, text)
    assert message["content"] == text and message["tool_calls"] is None
    assert run(HermesParser, text)[1] is False


def test_hermes_unterminated_call_and_odd_arguments():
    # Cut off before </tool_call> (as vLLM's regex also accepts), arguments as a JSON string
    # (unwrapped to the JSON text inside), no arguments at all ({}), null arguments ({}).
    text = ('<tool_call>{"name": "s", "arguments": "{\\"q\\": 1}"}</tool_call>'
            '<tool_call>{"name": "bare"}</tool_call><tool_call>{"name": "n", "arguments": null}</tool_call>'
            '<tool_call>{"name": "cut", "arguments": {"a": [1, 2')
    message = check_every_split(HermesParser, text)
    names = [c["function"]["name"] for c in message["tool_calls"]]
    args = [c["function"]["arguments"] for c in message["tool_calls"]]
    assert names == ["s", "bare", "n", "cut"]
    assert args == ['{"q": 1}', "{}", "{}", '{"a": [1, 2']
    assert message["content"] is None


def test_hermes_streams_arguments_before_the_call_ends():
    text = '<tool_call>{"name": "f", "arguments": {"text": "' + "x" * 20 + '"}}</tool_call>'
    _, _, deltas = run(HermesParser, text, range(len(text)))
    first = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    assert deltas[first]["tool_calls"][0]["function"]["name"] == "f"
    pieces = [d for d in deltas if d.get("tool_calls")]
    assert len(pieces) > 20  # the arguments came piece by piece, not in one lump at the end


@pytest.mark.parametrize("text,expected", [
    ('<|python_tag|>{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + "}",
     [("get_weather", WEATHER)]),
    ('{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}', [("a", {"x": 1}), ("b", {})]),
    ('  \n{"name": "a", "parameters": {}};', [("a", {})]),
])
def test_llama3_json_calls(text, expected):
    message = check_every_split(Llama3JsonParser, text)
    assert calls(message) == expected and message["content"] is None


@pytest.mark.parametrize("text", [
    "The weather is fine.", '{"answer": 42}', '{"name": "Bob", "age": 3}', " <|python", "",
    'Sure: {"name": "a", "parameters": {}}',
])
def test_llama3_json_content(text):
    message = check_every_split(Llama3JsonParser, text)
    assert message["content"] == (text or None) and message["tool_calls"] is None


def test_named_call_is_the_whole_output():
    args = " " + json.dumps(WEATHER, indent=1)
    message = check_every_split(lambda: NamedCall("get_weather"), args)
    assert calls(message) == [("get_weather", WEATHER)]
    assert message["tool_calls"][0]["function"]["arguments"] == args.lstrip()
    assert run(lambda: NamedCall("f"), "{}")[1] is False  # finish_reason stays "stop", as OpenAI's


def test_required_calls_array():
    text = json.dumps([{"name": "get_weather", "parameters": WEATHER}, {"name": "get_time", "parameters": {}}],
                      indent=2)
    message = check_every_split(RequiredCalls, text)
    assert calls(message) == [("get_weather", WEATHER), ("get_time", {})] and message["content"] is None
    assert run(RequiredCalls, text)[1] is True
