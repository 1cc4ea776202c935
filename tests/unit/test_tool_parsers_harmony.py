"""GPT-OSS's harmony messages (`openai`): reasoning, calls and the answer from one parser."""
from __future__ import annotations

import json

from rill.asgi.parsers.chat_parsing import parser_factory
from rill.asgi.parsers.reasoning import REASONING_PARSERS
from rill.asgi.parsers.tools.harmony import HarmonyParser
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan
from tests.helpers.parser_checks import check_every_split

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. {not a call}<|end|>"


def test_reasoning_then_a_call():
    text = (ANALYSIS + "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
            '<|message|>{"city": "Paris"}<|call|>')
    message = check_every_split(HarmonyParser, text)
    assert message["reasoning_content"] == "The user wants the weather. {not a call}" and message["content"] is None
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_reasoning_then_the_final_answer_and_a_preamble():
    text = (ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>Let me see.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.")
    message = check_every_split(HarmonyParser, text)
    assert message["content"] == "Let me see.It is sunny in Paris." and message["tool_calls"] is None
    assert message["reasoning_content"] == "The user wants the weather. {not a call}"


def test_the_recipient_before_the_channel_an_empty_call_and_other_tools():
    text = ("<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|><|call|>"
            "<|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"q\": 1}<|end|>")
    message = check_every_split(HarmonyParser, text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_time", {})]
    assert message["reasoning_content"] == '{"q": 1}'  # a built-in tool's call: not Rill's to make


def test_text_that_is_not_harmony_is_content_and_a_cut_off_header_writes_nothing():
    for plain in ("Hello there", "  <|chan is not a marker", ""):
        assert check_every_split(HarmonyParser, plain)["content"] == (plain or None)
    assert check_every_split(HarmonyParser, ANALYSIS + "<|start|>assistant<|channel|>fin") == {
        "content": None, "reasoning_content": "The user wants the weather. {not a call}", "tool_calls": None}


def test_it_replaces_the_reasoning_parser_and_serves_as_one():
    tools = [{"type": "function", "function": {"name": "get_time"}}]
    parser = parser_factory(ToolPlan(ToolMode.AUTO, tools), tool_parser="openai", reasoning_parser="qwen3")()
    assert isinstance(parser, HarmonyParser)
    assert REASONING_PARSERS["openai_gptoss"] is HarmonyParser
