"""Tool-call parsers as pure units: glm45 (GLM-4.5 to 4.7: keys and values, typed by the tools' schemas), minimax_m2,
seed_oss and kimi_k2 (Kimi K2's special markers, the model's own call ids)."""
from __future__ import annotations

import json

import pytest

from rill.asgi.parsers.tools.glm45 import Glm45Parser
from rill.asgi.parsers.tools.kimi_k2 import KimiK2Parser
from tests.helpers.parser_checks import check_every_split, run

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "where": {"type": "object"}, "code": {"type": "string"}}}}}]


def glm(tools=TOOLS):
    return lambda: Glm45Parser(tools=tools)


def glm_call(name: str, *pairs: tuple[str, str]) -> str:
    return (f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
            + "</tool_call>")


def calls(message: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"] or []]


def test_glm_values_are_typed_by_the_schema():
    text = glm_call("get_weather", ("city", "42"), ("days", "3"), ("metric", "True"), ("where", '{"lat": 1}'))
    assert calls(check_every_split(glm(), text)) == [
        ("get_weather", '{"city": "42", "days": 3, "metric": true, "where": {"lat": 1}}')]
    assert calls(check_every_split(glm(None), text)) == [  # no schema: JSON where it reads as JSON
        ("get_weather", '{"city": 42, "days": 3, "metric": "True", "where": {"lat": 1}}')]


def test_glm_string_values_keep_their_text_and_content_surrounds_calls():
    code = "\n  if a < b:\n    return '<x>'\n"
    text = "Sure.\n" + glm_call("get_weather", ("code", code)) + "\nand " + glm_call("get_time") + " done"
    message = check_every_split(glm(), text)
    assert calls(message) == [("get_weather", json.dumps({"code": code})), ("get_time", "{}")]
    assert message["content"] == "Sure.\n\nand done" and run(glm(), text)[1] is True


def test_glm_a_name_on_its_own_line_and_a_name_with_no_newline():
    for text in ("<tool_call>\nget_time\n</tool_call>", "<tool_call>get_time</tool_call>",
                 "<tool_call>get_weather<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"):
        [(name, _)] = calls(check_every_split(glm(), text))
        assert name in ("get_time", "get_weather")


def test_glm_tool_call_tags_without_a_name_are_content():
    for text in ("a <tool_call><arg_key>x</arg_key></tool_call> b", "<tool_call>\n</tool_call>!", "x <tool_call>"):
        message = check_every_split(glm(), text)
        assert message["tool_calls"] is None and message["content"] == text


def test_glm_a_key_without_a_value_is_left_out_and_a_cut_off_call_is_closed():
    text = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_key>days</arg_key>\n<arg_value>4</arg_value>\n"
            "</tool_call>")
    assert calls(check_every_split(glm(), text)) == [("get_weather", '{"days": 4}')]
    cut = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par"
    assert calls(check_every_split(glm(), cut)) == [("get_weather", '{"city": "Par"}')]


def test_glm_unicode_as_written():
    message = check_every_split(glm(), "天気。" + glm_call("get_weather", ("city", "東京 🌸")))
    assert message["content"] == "天気。" and calls(message) == [("get_weather", '{"city": "東京 🌸"}')]


SECTION = "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>"
KIMI_CALL = "<|tool_call_begin|>{}<|tool_call_argument_begin|>{}<|tool_call_end|>"


def test_kimi_calls_keep_the_models_ids():
    text = "Checking." + SECTION.format(KIMI_CALL.format("functions.get_weather:0", '{"city": "Oslo"}')
                                       + KIMI_CALL.format("functions.get_time:1", "{}")) + " Done."
    message = check_every_split(KimiK2Parser, text)
    assert calls(message) == [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]
    assert [c["id"] for c in message["tool_calls"]] == ["functions.get_weather:0", "functions.get_time:1"]
    assert message["content"] == "Checking. Done."


@pytest.mark.parametrize("text, expected", [
    (SECTION.format(KIMI_CALL.format("functions.get_weather:0", '{"city": "Ri')).removesuffix(
        "<|tool_call_end|><|tool_calls_section_end|>"), [("get_weather", '{"city": "Ri')]),  # cut off
    (SECTION.format(KIMI_CALL.format("get_time", "")), [("get_time", "{}")]),  # no `functions.` and index
])
def test_kimi_cut_off_and_bare_names(text, expected):
    assert calls(check_every_split(KimiK2Parser, text)) == expected


def test_minimax_names_and_keys_lose_their_quotes_and_values_are_typed():
    from rill.asgi.parsers.tools.minimax_m2 import MiniMaxM2Parser

    text = ("Ok.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"days\">\n 3 \n</parameter>\n"
            "<parameter name='city'>  New York  </parameter>\n</invoke>\n</minimax:tool_call> after")
    message = check_every_split(lambda: MiniMaxM2Parser(tools=TOOLS), text)
    assert calls(message) == [("get_weather", '{"days": 3, "city": "New York"}')]
    assert message["content"] == "Ok.\n after"


def test_seed_oss_calls_in_its_own_tags_with_typed_values():
    from rill.asgi.parsers.tools.auto import pick_tool_parser
    from rill.asgi.parsers.tools.seed_oss import SeedOssParser

    text = ("Checking.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
            "<parameter=days>2</parameter>\n</function>\n</seed:tool_call>")
    message = check_every_split(lambda: SeedOssParser(tools=TOOLS), text)
    assert calls(message) == [("get_weather", '{"city": "Paris", "days": 2}')]
    assert message["content"] == "Checking.\n"  # as qwen3_coder keeps the text before a call
    plain = check_every_split(lambda: SeedOssParser(tools=TOOLS), "<tool_call>not its tag</tool_call>")
    assert calls(plain) == [] and plain["content"] == "<tool_call>not its tag</tool_call>"
    assert pick_tool_parser("{{ '<seed:tool_call>\\n<function=' + name }}") == "seed_oss"


@pytest.mark.parametrize("text,expected,content", [
    ('Let me check.<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_weather", "arguments": {"days": 2}}]</tool_calls>',
     [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"days": 2}')], "Let me check."),
    ('<tool_calls>\n[{"name": "get_weather", "arguments": {}}]\n</tool_calls> done', [("get_weather", "{}")], " done"),
    ("No calls, <tool_calls> is just text here.", [], "No calls, <tool_calls> is just text here."),
    ('<tool_calls>[{"name": "get_weather", "arguments": {"city": "Pa', [("get_weather", '{"city": "Pa')], None),
])
def test_hunyuan_calls_follow_any_text_in_their_tags(text, expected, content):
    from rill.asgi.parsers.tools.hunyuan import HunyuanParser

    message = check_every_split(lambda: HunyuanParser(tools=TOOLS), text)
    assert calls(message) == expected
    assert message["content"] == content


def test_auto_tells_hunyuans_tag_from_hermes():
    from rill.asgi.parsers.tools.auto import pick_tool_parser

    assert pick_tool_parser("{{ '<tool_calls>' + calls | tojson + '</tool_calls>' }}") == "hunyuan_a13b"
    assert pick_tool_parser("{{ '<tool_call>' + call | tojson + '</tool_call>' }}") == "hermes"
