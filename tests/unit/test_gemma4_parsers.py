"""Gemma 4's output: its calls (`gemma4`: `<|tool_call>call:NAME{...}<tool_call|>`, arguments in its own syntax) and
its thinking (`--reasoning-parser gemma4`: `<|channel>thought\\n...<channel|>`), each read split every way."""
from __future__ import annotations

import json

import pytest

from rill.asgi.parsers.chat_parsing import parser_factory
from rill.asgi.parsers.reasoning import REASONING_PARSERS
from rill.asgi.parsers.tools.gemma4 import Gemma4Parser
from rill.asgi.parsers.tools.gemma4_args import MAX_DEPTH, read_arguments
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan
from tests.helpers.parser_checks import check_every_split

Q = '<|"|>'


def calls_of(message: dict) -> list[tuple[str, object]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"] or []]


def test_arguments_of_every_kind_become_json():
    text = (f"{{city:{Q}Paris, {{not}} \"a\" [key]{Q},days:3,ratio:-1.5e2,metric:true,note:null,"
            f"hours:[9,{Q}noon{Q},[1]],opts:{{deep:{{x:{Q}y{Q}}},flag:false}},{Q}odd key{Q}:1,bare:word}}")
    assert read_arguments(text) == {"city": 'Paris, {not} "a" [key]', "days": 3, "ratio": -150.0, "metric": True,
                                    "note": None, "hours": [9, "noon", [1]], "opts": {"deep": {"x": "y"}, "flag": False},
                                    "odd key": 1, "bare": "word"}
    assert read_arguments("{ a : 1 , b : [ ] }") == {"a": 1, "b": []}
    # Cut off: what it has
    assert read_arguments("{a:[1,2") == {"a": [1, 2]} and read_arguments(f"{{a:{Q}cut") == {"a": "cut"}
    assert read_arguments("{a:1,b") == {"a": 1} and read_arguments("{a:[1}") == {"a": [1]}
    # Nesting past MAX_DEPTH (a model's output a prompt can steer) reads the rest as one string, never deeper
    value, lists = read_arguments("{a:" + "[" * 5000)["a"], 0
    while isinstance(value, list):
        value, lists = value[0], lists + 1
    assert lists == MAX_DEPTH and value == "[" * (5000 - MAX_DEPTH)


def test_calls_between_content():
    text = (f"Let me check.\n<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>"
            f"<|tool_call>call:get-time.now{{}}<tool_call|>\n")
    message = check_every_split(Gemma4Parser, text)
    assert message["content"] == "Let me check.\n"
    assert calls_of(message) == [("get_weather", {"city": "Paris", "days": 2}), ("get-time.now", {})]


def test_not_a_call_is_content_and_a_call_cut_off_keeps_what_it_has():
    not_call = f"A <|tool_call>nothing{Q}<tool_call|> here"
    message = check_every_split(Gemma4Parser, not_call)
    assert message["content"] == not_call and message["tool_calls"] is None
    message = check_every_split(Gemma4Parser, f"<|tool_call>call:get_weather{{city:{Q}Par")
    assert calls_of(message) == [("get_weather", {"city": "Par"})] and message["content"] is None
    assert check_every_split(Gemma4Parser, "Plain text, no calls.")["content"] == "Plain text, no calls."


@pytest.mark.parametrize(("text", "reasoning", "content"), [
    ("<|channel>thought\nThe user greets me.<channel|>Hello!", "The user greets me.", "Hello!"),
    ("<|channel>No label.<channel|>Hi", "No label.", "Hi"),
    ("Hello without thinking.", None, "Hello without thinking."),
])
def test_the_thought_channel_is_the_reasoning(text, reasoning, content):
    message = check_every_split(REASONING_PARSERS["gemma4"], text)
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)


def test_a_call_after_the_thinking_ends_it():
    """Gemma 4 may open a call straight from its thought channel: the call ends the thinking."""
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    make = parser_factory(ToolPlan(ToolMode.AUTO, tools), tool_parser="gemma4", reasoning_parser="gemma4")
    text = f"<|channel>thought\nWeather, then.<|tool_call>call:get_weather{{city:{Q}Rome{Q}}}<tool_call|>"
    message = check_every_split(make, text)
    assert message["reasoning_content"] == "Weather, then."
    assert calls_of(message) == [("get_weather", {"city": "Rome"})] and message["content"] is None
