"""`strict` functions with tool_choice auto: the grammar holds a call's arguments to its schema once the model
opens it, in each parser's own call text, which the parser then reads back."""
from __future__ import annotations

import json

import pytest

from rill.asgi.parsers.tools import TOOL_PARSERS
from rill.asgi.requests.strict_calls import strict_calls
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan
from tests.helpers.grammar_checks import admits
from tests.helpers.parser_checks import check_every_split

CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "days": {"type": "integer"}},
    "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
WITH_TAGS = sorted(name for name, parser in TOOL_PARSERS.items() if getattr(parser, "call_tag", None) is not None)


def plan(strict=("get_weather",), max_calls=None) -> ToolPlan:
    return ToolPlan(ToolMode.AUTO, [CITY, TIME], max_calls=max_calls, strict=strict)


def arguments_text(parser: str, arguments: dict) -> str:
    """A call's arguments written the parser's way: JSON, or one of the XML formats' parameters."""
    style = getattr(TOOL_PARSERS[parser], "call_style", "json")
    plain = {key: value if isinstance(value, str) else json.dumps(value) for key, value in arguments.items()}
    if style == "qwen_xml":
        return "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in plain.items())
    if style == "glm_xml":
        return "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n" for key, value in plain.items())
    if style == "minimax_xml":
        return "".join(f'<parameter name="{key}">{value}</parameter>\n' for key, value in plain.items())
    if style == "gemma":  # Gemma 4's: bare keys, strings between its markers
        quoted = {key: f'<|"|>{value}<|"|>' if isinstance(value, str) else json.dumps(value)
                  for key, value in arguments.items()}
        return "{" + ",".join(f"{key}:{value}" for key, value in quoted.items()) + "}"
    return json.dumps(arguments)


def call_text(parser: str, name: str, arguments: dict) -> str:
    _, begin, end = TOOL_PARSERS[parser].call_tag
    index = "3" + TOOL_PARSERS[parser].call_index if parser == "kimi_k2" else ""  # the model's own index
    text = begin.replace("NAME", name) + index + arguments_text(parser, arguments) + end
    if block := getattr(TOOL_PARSERS[parser], "call_block", None):  # MiniMax's block around its calls
        text = block[0] + text + block[1]
    if parser.startswith("deepseek"):  # the calls' block around the call: free text to the grammar
        text = "<｜tool▁calls▁begin｜>" + text + "<｜tool▁calls▁end｜>"
    if parser == "kimi_k2":  # its section, the same
        text = "<|tool_calls_section_begin|>" + text + "<|tool_calls_section_end|>"
    return text


def test_the_formats_with_a_fixed_call_text():
    assert WITH_TAGS == ["deepseek_v3", "deepseek_v31", "ernie45", "gemma4", "glm45", "glm47", "hermes", "kimi_k2",
                         "llama3_json", "minimax_m2", "mistral", "qwen3_coder", "seed_oss"]  # ernie45: hermes'; glm47: glm45's
    for parser in ("pythonic", "olmo3"):
        assert strict_calls(plan(), parser) is None
    assert strict_calls(plan(strict=()), "hermes") is None  # nothing strict: no grammar
    assert strict_calls(ToolPlan(ToolMode.NONE, [CITY]), "hermes") is None


@pytest.mark.parametrize("parser", WITH_TAGS)
def test_a_strict_call_follows_its_schema_and_reads_back(parser):
    spec = strict_calls(plan(), parser)
    good = call_text(parser, "get_weather", {"city": "Paris", "days": 3})
    lead = "" if parser == "llama3_json" else "Let me look. "  # llama3_json reads only an output that is calls
    assert admits(spec, lead + good) and admits(spec, "No call needed.")
    assert not admits(spec, lead + call_text(parser, "get_weather", {"city": "Berlin"}))  # not in the enum
    assert not admits(spec, lead + call_text(parser, "get_weather", {"city": "Rome", "days": "three"}))
    assert not admits(spec, lead + call_text(parser, "get_weather", {"town": "Paris"}))
    assert not admits(spec, lead + call_text(parser, "get_news", {}))  # not a tool
    assert admits(spec, lead + call_text(parser, "get_time", {"anything": [1]}))  # not strict: any object
    message = check_every_split(lambda: TOOL_PARSERS[parser](tools=[CITY, TIME]), lead + good)
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}
    if parser == "kimi_k2":  # the id the model wrote, its index included
        assert call["id"] == "functions.get_weather:3"


def test_minimax_blocks_hold_several_calls_and_glm_takes_either_versions_newline():
    two = "<minimax:tool_call>\n" + "".join(
        f'<invoke name="get_weather">\n<parameter name="city">{city}</parameter>\n</invoke>\n' for city in ("Paris", "Rome")
    ) + "</minimax:tool_call>"
    assert admits(strict_calls(plan(), "minimax_m2"), two)
    assert not admits(strict_calls(plan(max_calls=1), "minimax_m2"), two)
    message = check_every_split(lambda: TOOL_PARSERS["minimax_m2"](tools=[CITY, TIME]), two)
    assert [json.loads(c["function"]["arguments"])["city"] for c in message["tool_calls"]] == ["Paris", "Rome"]
    glm = strict_calls(plan(), "glm45")
    for newline in ("\n", ""):  # GLM-4.5 writes one after the name, GLM-4.7 none
        text = f"<tool_call>get_weather{newline}<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"
        assert admits(glm, text)
        [call] = check_every_split(lambda: TOOL_PARSERS["glm45"](tools=[CITY, TIME]), text)["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}


def test_parallel_tool_calls_false_ends_at_the_first_call():
    one = call_text("hermes", "get_weather", {"city": "Rome"})
    assert admits(strict_calls(plan(), "hermes"), one + one)
    assert admits(strict_calls(plan(max_calls=1), "hermes"), one)
    assert not admits(strict_calls(plan(max_calls=1), "hermes"), one + one)


def test_kimi_s_call_index_is_the_model_s_own():
    spec = strict_calls(plan(), "kimi_k2")
    section = '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:{}<|tool_call_argument_begin|>' \
              '{{"city": "Rome"}}<|tool_call_end|><|tool_calls_section_end|>'
    assert admits(spec, section.format("0")) and admits(spec, section.format("12"))
    assert not admits(spec, section.format("")) and not admits(spec, section.format("x"))


@pytest.mark.parametrize(("parser", "begin", "end"), [("granite", "<|tool_call|>", ""), ("granite", "<tool_call>", ""),
                                                      ("phi4_mini_json", "functools", ""),
                                                      ("hunyuan_a13b", "<tool_calls>", "</tool_calls>")])
def test_an_array_of_calls_follows_the_schemas(parser, begin, end):
    """Granite's, Phi-4-mini's and Hunyuan's calls: from the marker, a JSON array of {name, arguments}."""
    def array(*calls):
        return begin + json.dumps([{"name": name, "arguments": arguments} for name, arguments in calls]) + end

    spec = strict_calls(plan(), parser)
    two = array(("get_weather", {"city": "Rome"}), ("get_time", {"anything": 1}))  # get_time: not strict
    lead = "Let me check." if parser == "hunyuan_a13b" else ""  # the others read only an output that is calls
    assert admits(spec, lead + two) and admits(spec, "No call needed.")
    assert not admits(spec, array(("get_weather", {"city": "Berlin"})))
    assert not admits(spec, array(("get_weather", {"town": "Rome"})))
    assert not admits(spec, array(("get_news", {})))
    assert not admits(spec, begin + "[]" + end)
    assert not admits(strict_calls(plan(max_calls=1), parser), two)
    assert admits(strict_calls(plan(max_calls=1), parser), array(("get_weather", {"city": "Paris"})))
    message = check_every_split(lambda: TOOL_PARSERS[parser](tools=[CITY, TIME]), lead + two)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Rome"}), ("get_time", {"anything": 1})]
