"""Tool-call parsers as pure units: mistral (both forms), pythonic and granite."""
from __future__ import annotations

import itertools
import json

import pytest

from rill.asgi.parsers.tools.granite import GraniteParser
from rill.asgi.parsers.tools.mistral import MistralParser
from rill.asgi.parsers.tools.pythonic import PythonicParser
from tests.helpers.parser_checks import check_every_split, run

WEATHER = {"city": "Paris", "units": ["C", {"nested": "}]\"{"}], "n": -1.5e3, "ok": True, "none": None}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def calls(message: dict) -> list[tuple[str, object]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"] or []]


def raw_calls(message: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"] or []]


def counting_ids():
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


def pushed(parser, pieces: list[str]) -> list[dict]:
    return [parser.push(piece) for piece in pieces] + [parser.finish()]


def test_constructors_take_make_id_and_tools():
    for parser_class in (MistralParser, PythonicParser, GraniteParser):
        parser = parser_class(make_id=lambda: "call_fixed", tools=TOOLS)
        assert parser.called_tools is False
    # The markers of Mistral and Granite 3.0 are special tokens: the detokenizer must keep them.
    assert MistralParser.reads_special_tokens and GraniteParser.reads_special_tokens
    assert not getattr(PythonicParser, "reads_special_tokens", False)


# -- mistral ---------------------------------------------------------------------------------------


def test_mistral_name_form_content_then_two_calls():
    text = ('Let me check.[TOOL_CALLS]get_weather[ARGS]' + json.dumps(WEATHER)
            + '[TOOL_CALLS]get_time[ARGS]{}\n')
    message = check_every_split(MistralParser, text)
    assert message["content"] == "Let me check."
    assert calls(message) == [("get_weather", WEATHER), ("get_time", {})]
    assert message["tool_calls"][0]["function"]["arguments"] == json.dumps(WEATHER)  # as written
    assert run(MistralParser, text)[1] is True


def test_mistral_call_id_is_dropped_and_whitespace_after_args_is_allowed():
    text = '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS] {"city": "Paris"}'
    message = check_every_split(MistralParser, text)
    assert raw_calls(message) == [("get_weather", '{"city": "Paris"}')] and message["content"] is None
    assert message["tool_calls"][0]["id"].startswith("call_")  # our own id, not Mistral's


def test_mistral_array_form():
    text = ("Sure.\n[TOOL_CALLS] [" + json.dumps({"name": "get_weather", "arguments": WEATHER})
            + ',\n {"arguments": {}, "name": "get_time"}]\n')
    message = check_every_split(MistralParser, text)
    assert message["content"] == "Sure.\n"
    assert calls(message) == [("get_weather", WEATHER), ("get_time", {})]
    assert message["tool_calls"][0]["function"]["arguments"] == json.dumps(WEATHER)


def test_mistral_forms_mixed_number_calls_in_order():
    text = '[TOOL_CALLS]a[ARGS]{"x": 1} [TOOL_CALLS][{"name": "b", "arguments": {"y": "]"}}] and [TOOL_CALLS]c[ARGS]{}'
    message = check_every_split(MistralParser, text)
    assert raw_calls(message) == [("a", '{"x": 1}'), ("b", '{"y": "]"}'), ("c", "{}")]
    assert message["content"] == " and"
    ids = run(lambda: MistralParser(make_id=counting_ids()), text)[0]["tool_calls"]
    assert [c["id"] for c in ids] == ["call_0", "call_1", "call_2"]


@pytest.mark.parametrize("text", [
    "Hello there!\n", "Use [brackets] and [TOOL_CALL without the end", "  x  ", "", "[TOOL_CALLS",
    "[TOOL_CALLS]", "[TOOL_CALLS] I cannot call tools.", "[TOOL_CALLS][1, 2]", "[TOOL_CALLS][]",
    "[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS]f[ARGS]", "[TOOL_CALLS]f[ARGS] x", "[TOOL_CALLS]f{}",
    '[TOOL_CALLS][{"city": "Paris"}]', "[TOOL_CALLS]f[CALL_ID]ab-c[ARGS]{}",
])
def test_mistral_non_calls_stay_content(text):
    message = check_every_split(MistralParser, text)
    assert message["content"] == (text or None) and message["tool_calls"] is None
    assert run(MistralParser, text)[1] is False


def test_mistral_text_that_stops_being_calls_is_content_from_there():
    # After a call, the array's first item that is not a call and all after it are content;
    # a later marker still starts calls.
    text = '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"x": 1}, 5] ok [TOOL_CALLS]g[ARGS]{}'
    message = check_every_split(MistralParser, text)
    assert raw_calls(message) == [("f", "{}"), ("g", "{}")]
    assert message["content"] == '{"x": 1}, 5] ok'


@pytest.mark.parametrize("text,expected_calls,content", [
    # Cut off inside the arguments: the call keeps its name and its arguments as far as written.
    ('[TOOL_CALLS]f[ARGS]{"a": [1, 2', [("f", '{"a": [1, 2')], None),
    ('[TOOL_CALLS][{"name": "f", "arguments": {"a": "x', [("f", '{"a": "x')], None),
    # Cut off before the call could be told apart (an item needs its arguments): the text stays content.
    ('[TOOL_CALLS][{"name": "f"', [], '[TOOL_CALLS][{"name": "f"'),
    ('[TOOL_CALLS][{"na', [], '[TOOL_CALLS][{"na'),
    ("[TOOL_CALLS]get_wea", [], "[TOOL_CALLS]get_wea"),
    # Cut off between array items: the calls stand, nothing more.
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}, ', [("f", "{}")], None),
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name', [("f", "{}")], '{"name'),
])
def test_mistral_cut_off(text, expected_calls, content):
    message = check_every_split(MistralParser, text)
    assert raw_calls(message) == expected_calls and message["content"] == content


def test_mistral_streams_arguments_before_the_call_ends():
    parser = MistralParser(make_id=counting_ids())
    deltas = pushed(parser, ["Hi [TOOL_C", "ALLS]get_weather[AR", 'GS]{"city": ', '"Par', 'is"}', " "])
    assert deltas == [
        {"content": "Hi"}, {"content": " "},  # the space before a marker, once it is one
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Par'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'is"}'}}]},
        {}, {},
    ]
    parser = MistralParser(make_id=counting_ids())
    deltas = pushed(parser, ['[TOOL_CALLS][{"name": "f", "arguments": {"q": "a', 'bc"}}', "]"])
    assert deltas == [
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "f", "arguments": '{"q": "a'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'bc"}'}}]},
        {}, {},
    ]


# -- pythonic --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected,content", [
    ('[get_weather(city="San Francisco", metric="celsius"), get_time()]',
     [("get_weather", '{"city": "San Francisco", "metric": "celsius"}'), ("get_time", "{}")], None),
    ('<|python_start|>[get_weather(city="Paris")]<|python_end|>', [("get_weather", '{"city": "Paris"}')], None),
    ("  \n[\n  f(a=1),\n  g(b='x'),\n]\n", [("f", '{"a": 1}'), ("g", '{"b": "x"}')], None),
    ('<|python_start|>[f()] <|python_end|>\nDone.', [("f", "{}")], "\nDone."),
    ("[f()] and that is all \n", [("f", "{}")], " and that is all"),
])
def test_pythonic_calls(text, expected, content):
    message = check_every_split(PythonicParser, text)
    assert raw_calls(message) == expected and message["content"] == content
    assert run(PythonicParser, text)[1] is True


def test_pythonic_literal_values_become_json():
    text = ("[f(none=None, yes=True, no=False, n=-1.5e3, i=0x10, s='it\\'s \"q\" ) ]', u=\"héllo\\n\", "
            "t=(1, [2, {'k': (3,)}]), d={1: 'one', 'two': [None]}, long='''a\n'b' ''c''',"
            ' e="")]')
    message = check_every_split(PythonicParser, text)
    assert raw_calls(message) == [("f", json.dumps({
        "none": None, "yes": True, "no": False, "n": -1500.0, "i": 16, "s": "it's \"q\" ) ]", "u": "héllo\n",
        "t": [1, [2, {"k": [3]}]], "d": {"1": "one", "two": [None]}, "long": "a\n'b' ''c", "e": ""},
        ensure_ascii=False))]
    assert "héllo" in message["tool_calls"][0]["function"]["arguments"]  # not escaped to \\u00e9


@pytest.mark.parametrize("text", [
    "The weather is fine.", "", "  \n", "[1, 2]", "[link](https://example.com)", "[]", "[ ]", "[TODO] later",
    "[print(x)]", "[f(1)]", "[f(x=y)]", "[f(**kw)]", "[f(x={1, 2})]", "[f(x=1e999)]", "[f(x=b'raw')]",
    "[obj.method(x=1)]", "[f (x=1)]", "Sure: [f()]", "<|python_start|>print(1)<|python_end|>",
    "<|python_start|>", "<|python", "[f(x=1", "[get_wea",
])
def test_pythonic_non_calls_stay_content(text):
    # (The last two are cut off before the first call's ")": the text stays content as written.)
    message = check_every_split(PythonicParser, text)
    assert message["content"] == (text or None) and message["tool_calls"] is None
    assert run(PythonicParser, text)[1] is False


@pytest.mark.parametrize("text,expected,content", [
    # After a call, the first item that is not a call and all after it are content.
    ("[f(x=1), 5, g()]", [("f", '{"x": 1}')], "5, g()]"),
    ("[f(x=1), g(y=z)]", [("f", '{"x": 1}')], "g(y=z)]"),
    ("[f(x=1) g()]", [("f", '{"x": 1}')], "g()]"),
    # A call cut off before its ")" was never sent: its text is content as written.
    ('[f(x=1), g(y="ab', [("f", '{"x": 1}')], 'g(y="ab'),
    # Cut off between items: the calls stand.
    ("[f(x=1), ", [("f", '{"x": 1}')], None),
    ("[f(x=1)", [("f", '{"x": 1}')], None),
])
def test_pythonic_broken_or_cut_off_after_a_call(text, expected, content):
    message = check_every_split(PythonicParser, text)
    assert raw_calls(message) == expected and message["content"] == content


def test_pythonic_sends_each_call_whole_at_its_closing_paren():
    parser = PythonicParser(make_id=counting_ids())
    deltas = pushed(parser, ['[get_weather(city="Pa', 'ris")', ", get_time(", ")", "]"])
    assert deltas == [
        {},
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {},
        {"tool_calls": [{"index": 1, "id": "call_1", "type": "function",
                         "function": {"name": "get_time", "arguments": "{}"}}]},
        {}, {},
    ]
    # A triple quote split across pieces is still read as one.
    parser = PythonicParser(make_id=counting_ids())
    deltas = pushed(parser, ['[f(s="', '"', '"a)"""', ")]"])
    assert deltas[-2]["tool_calls"][0]["function"]["arguments"] == '{"s": "a)"}'


# -- granite ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["<|tool_call|>", "<tool_call>", " \n<tool_call> ", ""])
def test_granite_calls(prefix):
    body = json.dumps([{"name": "get_weather", "arguments": WEATHER}, {"name": "get_time", "arguments": {}}],
                      indent=1)
    message = check_every_split(GraniteParser, prefix + body + "\n")
    assert calls(message) == [("get_weather", WEATHER), ("get_time", {})] and message["content"] is None
    assert message["tool_calls"][0]["function"]["arguments"] == json.dumps(WEATHER, indent=1).replace("\n", "\n  ")
    assert run(GraniteParser, prefix + body)[1] is True


@pytest.mark.parametrize("text", [
    "Hello!", "", "  \n", "[1, 2]\n", "<tool_call>not json", "<|tool_call|>", "<tool_call>[]",
    'Sure: <tool_call>[{"name": "f", "arguments": {}}]', '[{"name": "Bob"}]', "[see above](#x)",
])
def test_granite_non_calls_stay_content(text):
    message = check_every_split(GraniteParser, text)
    assert message["content"] == (text or None) and message["tool_calls"] is None
    assert run(GraniteParser, text)[1] is False


@pytest.mark.parametrize("text,expected,content", [
    ('<tool_call>[{"name": "f", "arguments": {}}]\n\nDone. ', [("f", "{}")], "\n\nDone."),
    ('<tool_call>[{"name": "f", "arguments": {}}, [1]]', [("f", "{}")], "[1]]"),
    # Cut off inside the arguments: the call keeps them as far as written.
    ('<|tool_call|>[{"name": "f", "arguments": {"a": [1', [("f", '{"a": [1')], None),
])
def test_granite_text_after_and_cut_off(text, expected, content):
    message = check_every_split(GraniteParser, text)
    assert raw_calls(message) == expected and message["content"] == content


def test_granite_streams_arguments_before_the_call_ends():
    parser = GraniteParser(make_id=counting_ids())
    deltas = pushed(parser, ["<|tool", '_call|>[{"name": "f", "arg', 'uments": {"q": ', '"abc"}}]'])
    assert deltas == [
        {}, {},
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "f", "arguments": '{"q": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"abc"}'}}]},
        {},
    ]


def test_phi4_mini_json_reads_functools_lists():
    from rill.asgi.parsers.tools.granite import Phi4MiniJsonParser

    text = 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
    message = check_every_split(Phi4MiniJsonParser, text)
    assert message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    for plain in ("functools are handy", "Sure, here it is."):
        assert check_every_split(Phi4MiniJsonParser, plain) == {"content": plain, "reasoning_content": None,
                                                                  "tool_calls": None}


@pytest.mark.parametrize("text,expected,content", [
    ('<function_calls>\nget_weather(city="Paris", metric=true, where=null)\nget_time()\n</function_calls>',
     [("get_weather", '{"city": "Paris", "metric": true, "where": null}'), ("get_time", "{}")], None),
    ("<function_calls>get_weather(city='Oslo')</function_calls> Done.", [("get_weather", '{"city": "Oslo"}')],
     " Done."),
    ("get_weather(city='Oslo')", [], "get_weather(city='Oslo')"),  # no tag: content, as pythonic without its list
    ("<function_calls>\nnot a call at all\n</function_calls>", [], "<function_calls>\nnot a call at all\n</function_calls>"),
    ('<function_calls>\nget_weather(city="true")\nget_weather(days=x)\n</function_calls>',
     [("get_weather", '{"city": "true"}')], "get_weather(days=x)\n</function_calls>"),
])
def test_olmo3_calls_one_a_line_with_json_literals(text, expected, content):
    from rill.asgi.parsers.tools.olmo3 import Olmo3Parser

    message = check_every_split(Olmo3Parser, text)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"] or []] == expected
    assert message["content"] == content
