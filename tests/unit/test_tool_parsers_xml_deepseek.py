"""Tool-call parsers as pure units: qwen3_coder (XML parameters typed by the tools' schemas), deepseek_v3
and deepseek_v31 (calls between DeepSeek's special markers)."""
from __future__ import annotations

import json

import pytest

from rill.asgi.parsers.tools.deepseek_v3 import DeepSeekV3Parser, DeepSeekV31Parser
from rill.asgi.parsers.tools.qwen3_coder import Qwen3CoderParser
from tests.helpers.parser_checks import check_every_split, run

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"},
        "metric": {"type": "boolean"}, "where": {"type": "object"}, "hours": {"type": "array"},
        "note": {"type": ["string", "null"]}, "code": {"type": "string"}, "nothing": {"type": "null"},
        "unit": {"enum": ["C", "F"]},
    }}}}]


def qwen(tools: list[dict] | None = TOOLS):
    return lambda: Qwen3CoderParser(tools=tools)


def xml_call(name: str, *params: tuple[str, str]) -> str:
    return (f"<tool_call>\n<function={name}>\n"
            + "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
            + "</function>\n</tool_call>")


def args(message: dict) -> list[tuple[str, str]]:
    """(name, arguments text) of each call: the exact text, so formatting counts."""
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"] or []]


# -- qwen3_coder ---------------------------------------------------------------------------------

def test_qwen3_coder_content_then_two_calls():
    text = ("Let me check.\n" + xml_call("get_weather", ("city", "San Francisco"), ("days", "3")) + "\n"
            + xml_call("get_time") + "\n")
    message = check_every_split(qwen(), text)
    assert message["content"] == "Let me check.\n"
    assert args(message) == [("get_weather", '{"city": "San Francisco", "days": 3}'), ("get_time", "{}")]
    assert run(qwen(), text)[1] is True


@pytest.mark.parametrize("key,value,with_schema,without_schema", [
    ("city", "42", "42", 42),
    ("city", "null", "null", None),
    ("days", "3", 3, 3),
    ("days", "3.5", "3.5", 3.5),
    ("days", "three", "three", "three"),
    ("scale", "1e3", 1000.0, 1000.0),
    ("scale", "-2", -2, -2),
    ("scale", "NaN", "NaN", "NaN"),  # no JSON to send on
    ("metric", "TRUE", True, "TRUE"),
    ("metric", "false", False, False),
    ("metric", "yes", "yes", "yes"),
    ("where", '{"lat": 1, "tags": ["a"]}', {"lat": 1, "tags": ["a"]}, {"lat": 1, "tags": ["a"]}),
    ("where", "{'lat': 1}", "{'lat': 1}", "{'lat': 1}"),
    ("hours", "[1, 2]", [1, 2], [1, 2]),
    ("note", "null", None, None),
    ("note", "7", "7", 7),
    ("nothing", "null", None, None),
    ("nothing", "0", "0", 0),
    ("unit", "C", "C", "C"),
    ("unit", '"F"', '"F"', '"F"'),  # a JSON string is kept as written
    ("undeclared", "[true]", [True], [True]),
    ("undeclared", "plain words", "plain words", "plain words"),
])
def test_qwen3_coder_types_values_by_schema(key, value, with_schema, without_schema):
    text = xml_call("get_weather", (key, value))
    for tools, expected in ((TOOLS, with_schema), (None, without_schema)):
        message = check_every_split(qwen(tools), text)
        assert args(message) == [("get_weather", json.dumps({key: expected}, ensure_ascii=False))]


def test_qwen3_coder_unknown_function_reads_values_as_json_or_text():
    text = xml_call("other", ("days", "3"), ("city", "Paris"))
    assert args(check_every_split(qwen(), text)) == [("other", '{"days": 3, "city": "Paris"}')]


def test_qwen3_coder_strips_one_newline_each_side_only():
    code = "\n  def f():\n      return '<b>'  \n\n"
    text = xml_call("get_weather", ("code", code))
    message = check_every_split(qwen(), text)
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"code": code}
    same_line = "<tool_call><function=get_weather><parameter=city>Oslo</parameter></function></tool_call>"
    assert args(check_every_split(qwen(), same_line)) == [("get_weather", '{"city": "Oslo"}')]


def test_qwen3_coder_unicode_is_written_as_is():
    text = "天気を見ます。\n" + xml_call("get_weather", ("city", "東京 🌸"), ("note", "“quoted” \\ \"x\""))
    message = check_every_split(qwen(), text)
    assert message["content"] == "天気を見ます。\n"
    assert args(message) == [("get_weather", '{"city": "東京 🌸", "note": "“quoted” \\\\ \\"x\\""}')]


def test_qwen3_coder_function_without_tool_call_tags():
    text = "Sure.\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\nDone."
    message = check_every_split(qwen(), text)
    assert args(message) == [("get_weather", '{"days": 2}')]
    assert message["content"] == "Sure.\n\nDone."


def test_qwen3_coder_non_call_tool_call_stays_content():
    text = "Sure <tool_call>{\"name\": \"f\"} <function=g></tool_call> done"
    message = check_every_split(qwen(), text)
    assert message["content"] == text and message["tool_calls"] is None
    assert run(qwen(), text)[1] is False
    # A `<function=` that opens no tag (no name, or a newline before `>`) is text too.
    for text in ("a <function=> b", "x <function=\nget_weather>", "<tool_call>\n<function=f\n</tool_call>!"):
        message = check_every_split(qwen(), text)
        assert message["content"] == text and message["tool_calls"] is None


def test_qwen3_coder_missing_closing_tags():
    # As vLLM: a value with no </parameter> ends at the next <parameter=, </function> or </tool_call>.
    text = ("<tool_call><function=get_weather><parameter=city>\nOslo\n<parameter=days>\n4\n</function></tool_call>"
            "<tool_call><function=get_time><parameter=zone>UTC</tool_call>")
    message = check_every_split(qwen(), text)
    assert args(message) == [("get_weather", '{"city": "Oslo", "days": 4}'), ("get_time", '{"zone": "UTC"}')]
    assert message["content"] is None


def test_qwen3_coder_two_functions_in_one_tool_call_and_spaced_names():
    text = ("<tool_call>\n<function= get_weather >\n<parameter= days >\n2\n</parameter>\n</function>\n"
            "<function=get_time>\n</function>\n</tool_call>\n")
    message = check_every_split(qwen(), text)
    assert args(message) == [("get_weather", '{"days": 2}'), ("get_time", "{}")] and message["content"] is None


@pytest.mark.parametrize("text", [
    xml_call("get_time") + " ok </tool_call>", "<tool_call><function=get_time></tool_call> ok </tool_call>",
])
def test_qwen3_coder_closing_tag_after_the_call_closed_is_content(text):
    message = check_every_split(qwen(), text)
    assert args(message) == [("get_time", "{}")] and message["content"] == " ok </tool_call>"


@pytest.mark.parametrize("text,expected", [
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Fran", '{"city": "San Fran"}'),
    ("<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n", '{"days": 3}'),
    ("<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=ci", '{"days": 3}'),
    ("<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</func", '{"days": 3}'),
    ("<function=get_weather>", "{}"),
])
def test_qwen3_coder_cut_off_call_is_closed_at_finish(text, expected):
    message = check_every_split(qwen(), text)
    assert args(message) == [("get_weather", expected)] and message["content"] is None


def test_qwen3_coder_cut_off_before_the_name_is_content():
    for text in ("Hm <tool_call>\n<function=get_wea", "Hm <tool_call>\n<func", "Hm <function=get"):
        message = check_every_split(qwen(), text)
        assert message["content"] == text and message["tool_calls"] is None


def test_qwen3_coder_streams_arguments_before_the_call_ends():
    text = xml_call("get_weather", ("city", "Oslo"), ("days", "3"))
    _, _, deltas = run(qwen(), text, range(len(text)))
    pieces = [(i, call) for i, d in enumerate(deltas) for call in d.get("tool_calls", ())]
    opened_at = text.index("get_weather>") + len("get_weather>")
    assert pieces[0] == (opened_at, {"index": 0, "id": pieces[0][1]["id"], "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{"}})
    first_end = text.index("</parameter>") + len("</parameter>")
    assert pieces[1] == (first_end, {"index": 0, "function": {"arguments": '"city": "Oslo"'}})
    assert [call["function"]["arguments"] for _, call in pieces[2:]] == [', "days": 3', "}"]
    assert pieces[3][0] == text.index("</function>") + len("</function>")


@pytest.mark.parametrize("text", [
    "Hello there!\n", "a < b and <tool is not a tag>", "  x  ", "", "<tool_cal", "<function", "</tool_call>",
    "<parameter=x>1</parameter>",
])
def test_qwen3_coder_plain_text_is_untouched(text):
    message = check_every_split(qwen(), text)
    assert message["content"] == (text or None) and message["tool_calls"] is None
    assert run(qwen(), text)[1] is False


# -- deepseek_v3 and deepseek_v31 ----------------------------------------------------------------

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


def v3_call(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"


def v31_call(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>"


WEATHER = '{"city": "Paris", "units": ["C", {"nested": "}]\\"{"}], "code": "```py\\nx\\n```"}'


@pytest.mark.parametrize("parser,call", [(DeepSeekV3Parser, v3_call), (DeepSeekV31Parser, v31_call)])
def test_deepseek_content_then_two_calls(parser, call):
    text = "Let me check.\n" + BEGIN + call("get_weather", WEATHER) + "\n" + call("get_time", "{}") + END
    message = check_every_split(parser, text)
    assert message["content"] == "Let me check.\n"
    assert args(message) == [("get_weather", WEATHER), ("get_time", "{}")]
    assert run(parser, text)[1] is True


@pytest.mark.parametrize("parser,call", [(DeepSeekV3Parser, v3_call), (DeepSeekV31Parser, v31_call)])
def test_deepseek_text_after_the_calls_is_content(parser, call):
    text = BEGIN + call("f", '{"a": 1}') + END + "\n\nI asked for it."
    message = check_every_split(parser, text)
    assert args(message) == [("f", '{"a": 1}')] and message["content"] == "\n\nI asked for it."
    text = BEGIN + call("f", '{"a": 1}') + END + "\n"
    assert check_every_split(parser, text)["content"] is None


@pytest.mark.parametrize("parser,call", [(DeepSeekV3Parser, v3_call), (DeepSeekV31Parser, v31_call)])
def test_deepseek_unicode(parser, call):
    arguments = '{"city": "東京", "emoji": "🌸", "escaped": "\\u6771"}'
    text = "天気: " + BEGIN + call("天気", arguments) + END
    message = check_every_split(parser, text)
    assert message["content"] == "天気: " and args(message) == [("天気", arguments)]


def test_deepseek_v3_arguments_as_written_without_the_fence():
    # Whitespace and backticks inside the JSON stay; only the fence and the whitespace at the end go.
    arguments = '{\n  "q": "a ` b``",\n  "n": 1\n}'
    text = (BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n" + arguments
            + "\n```\n<｜tool▁call▁end｜>" + END)
    assert args(check_every_split(DeepSeekV3Parser, text)) == [("search", arguments)]
    # Without a fence the arguments are read as they are; with none at all they are "{}".
    text = (BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n{\"x\": 1}<｜tool▁call▁end｜>"
            + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n<｜tool▁call▁end｜>"
            + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>c\n```json\n\n```<｜tool▁call▁end｜>" + END)
    assert args(check_every_split(DeepSeekV3Parser, text)) == [("a", '{"x": 1}'), ("b", "{}"), ("c", "{}")]


def test_deepseek_v31_empty_and_spaced_arguments():
    text = BEGIN + v31_call("a", "") + v31_call(" b ", "  ") + v31_call("c", '{"x": [1, 2]}  \n') + END
    assert args(check_every_split(DeepSeekV31Parser, text)) == [("a", "{}"), ("b", "{}"), ("c", '{"x": [1, 2]}')]


@pytest.mark.parametrize("parser,text,expected", [
    (DeepSeekV3Parser, BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"city\": \"Sa",
     [("f", '{"city": "Sa')]),
    (DeepSeekV3Parser, BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```js", [("f", "{}")]),
    (DeepSeekV3Parser, BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n``", [("f", "{}")]),
    (DeepSeekV3Parser, BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_wea", []),
    (DeepSeekV3Parser, BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}" + END,
     [("f", '{"a": 1}')]),
    (DeepSeekV31Parser, BEGIN + "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"city\": \"Sa", [("f", '{"city": "Sa')]),
    (DeepSeekV31Parser, BEGIN + "<｜tool▁call▁begin｜>f<｜tool▁sep｜>", [("f", "{}")]),
    (DeepSeekV31Parser, BEGIN + "<｜tool▁call▁begin｜>get_wea", []),
    (DeepSeekV31Parser, BEGIN + "<｜tool▁call▁begin｜>b<｜tool▁call▁end｜>" + v31_call("a", "{}"), [("a", "{}")]),
    (DeepSeekV3Parser, BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>b<｜tool▁call▁end｜>" + v3_call("a", "{}"),
     [("a", "{}")]),
])
def test_deepseek_cut_off_call_ends_with_what_came(parser, text, expected):
    message = check_every_split(parser, text)
    assert args(message) == expected and message["content"] is None
    assert run(parser, text)[1] is bool(expected)


@pytest.mark.parametrize("parser,call", [(DeepSeekV3Parser, v3_call), (DeepSeekV31Parser, v31_call)])
def test_deepseek_streams_arguments_before_the_call_ends(parser, call):
    arguments = '{"text": "' + "x" * 20 + '"}'
    text = BEGIN + call("f", arguments) + END
    _, _, deltas = run(parser, text, range(len(text)))
    pieces = [call for d in deltas for call in d.get("tool_calls", ())]
    assert pieces[0]["function"] == {"name": "f", "arguments": ""}
    assert len(pieces) > 20  # the arguments came piece by piece, not in one lump at the end
    assert "".join(p["function"]["arguments"] for p in pieces) == arguments


@pytest.mark.parametrize("parser", [DeepSeekV3Parser, DeepSeekV31Parser])
@pytest.mark.parametrize("text", [
    "Hello there!\n", "a <｜ b", "  x  ", "", "<｜tool▁calls", "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
])
def test_deepseek_plain_text_is_untouched(parser, text):
    message = check_every_split(parser, text)
    assert message["content"] == (text or None) and message["tool_calls"] is None
    assert run(parser, text)[1] is False
