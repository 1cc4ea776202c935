"""Reasoning parsers as pure units, alone and chained before a tool parser."""
from __future__ import annotations

import json

import pytest

from rill.asgi.parsers.chat_output import PlainText
from rill.asgi.parsers.chat_parsing import ReasoningThenTools, parser_factory
from rill.asgi.parsers.reasoning import REASONING_PARSERS
from rill.asgi.parsers.tools.forced import NamedCall, RequiredCalls
from rill.asgi.parsers.tools.hermes import HermesParser
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan
from tests.helpers.parser_checks import check_every_split

R1, QWEN3 = REASONING_PARSERS["deepseek_r1"], REASONING_PARSERS["qwen3"]


@pytest.mark.parametrize("make,text,reasoning,content", [
    (R1, "<think>\nLet me think.\n</think>\n\nParis.", "\nLet me think.\n", "\n\nParis."),
    (R1, "No opening tag < here.</think>Paris.", "No opening tag < here.", "Paris."),
    (R1, "Cut off while thinking <th", "Cut off while thinking <th", None),
    (R1, "  <think>x</think>", "x", None),
    (QWEN3, "<think>\nHmm.\n</think>\n\nParis.", "\nHmm.\n", "\n\nParis."),
    (QWEN3, "Paris, no thinking. </think> stays", None, "Paris, no thinking. </think> stays"),
    (QWEN3, "<think>never closed", "never closed", None),
    (QWEN3, "<thin", None, "<thin"),
    (QWEN3, "", None, None),
])
def test_think_tags(make, text, reasoning, content):
    message = check_every_split(make, text)
    assert (message["reasoning_content"], message["content"], message["tool_calls"]) == (reasoning, content, None)


@pytest.mark.parametrize("name,text,reasoning,content", [
    ("minimax_m2", "Plan it.</think>\nParis.", "Plan it.", "\nParis."),  # opened in the prompt
    ("step3", "<think>x</think>y", "x", "y"),
    ("glm45", "<think>Hmm.</think>Paris.", "Hmm.", "Paris."),
    ("glm45", "Paris, thinking off.", None, "Paris, thinking off."),
    ("mimo", "<think>a</think>b", "a", "b"),
    ("seed_oss", "<seed:think>Budget left.</seed:think>Paris.", "Budget left.", "Paris."),
    ("seed_oss", "<think>not its tag</think>", None, "<think>not its tag</think>"),
    ("mistral", "[THINK]Check units.[/THINK]42 km.", "Check units.", "42 km."),
    ("mistral", "42 km.", None, "42 km."),
    ("minimax_m2_append_think", "Plan it.</think>\nParis.", None, "<think>Plan it.</think>\nParis."),
    ("kimi_k2", "Look it up.</think>Paris.", "Look it up.", "Paris."),
    ("kimi_k2", "<think>Look it up.<|tool_calls_section_begin|>calls", "Look it up.", "<|tool_calls_section_begin|>calls"),
    ("kimi_k2", "Still thinking <|tool_calls_sec", "Still thinking <|tool_calls_sec", None),
    ("olmo3", "Opened in the prompt.</think>Paris.", "Opened in the prompt.", "Paris."),
    # ERNIE 4.5: the answer in <response> tags after newlines, or bare; its closing tag ends it
    ("ernie45", "abc\n</think>\n\n<response>\ndef\n</response>\n", "abc\n", "\ndef\n"),
    ("ernie45", "<think>abc\n</think>\ndef", "abc\n", "def"),
    ("ernie45", "abc</think>\n\n<resp", "abc", "<resp"),
    ("ernie45", "still thinking", "still thinking", None),
    # Hunyuan-A13B: thinking, then the answer in <answer> tags; its fast mode's empty thinking; no thinking at all
    ("hunyuan_a13b", "<think>\nWeigh it.\n</think>\n<answer>\nParis.\n</answer>", "Weigh it.", "Paris."),
    ("hunyuan_a13b", "<think>\n\n</think>\n<answer>\nParis.\n</answer>trailing", None, "Paris."),
    ("hunyuan_a13b", "Paris.\n</answer>", None, "Paris."),
    ("hunyuan_a13b", "<think>\nCut off", "Cut off", None),
    # Granite 3.2/3.3: plain-text markers, "Here is" or "Here's"
    ("granite", "Here is my thought process:\nAdd.\nHere is my response:\n4", "\nAdd.\n", "\n4"),
    ("granite", "Here's my thought process: Add. Here's my response: 4", " Add. ", " 4"),
    ("granite", "4, without thinking.", None, "4, without thinking."),
    ("granite", "Here is my thought process: still going", " still going", None),
])
def test_other_families_tags(name, text, reasoning, content):
    message = check_every_split(REASONING_PARSERS[name], text)
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)


def test_thinking_markers_follow_each_format():
    """Budgets and think-then-constrain (asgi/parsers/thinking_markers.py) read the same tags; Magistral's are
    special tokens, which the text keeps for its parser."""
    from rill.asgi.parsers.chat_parsing import keeps_special_tokens
    from rill.asgi.parsers.thinking_markers import thinking_markers

    assert thinking_markers("seed_oss").open == "<seed:think>" and thinking_markers("seed_oss").close == "</seed:think>"
    assert thinking_markers("minimax_m2").open == "" and thinking_markers("minimax_m2").close == "</think>"
    assert thinking_markers("minimax_m2_append_think") is None  # nothing splits its thinking off
    assert thinking_markers("hunyuan_a13b").close == "\n</think>\n<answer>\n"  # a spent budget opens the answer
    assert thinking_markers("granite").open == "Here is my thought process:"
    plain = ToolPlan(ToolMode.NONE, [])
    assert keeps_special_tokens(plain, None, "mistral") and not keeps_special_tokens(plain, None, "qwen3")


def test_reasoning_then_tool_calls():
    text = ('<think>The user wants weather; call the tool.</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    for name in ("deepseek_r1", "qwen3"):
        make = parser_factory(ToolPlan(ToolMode.AUTO, []), tool_parser="hermes", reasoning_parser=name)
        message = check_every_split(make, text)
        assert message["reasoning_content"] == "The user wants weather; call the tool."
        assert message["content"] == "\n\nChecking.\n"
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] \
            == [("get_weather", {"city": "Paris"})]
    # A call inside the thinking is not a call: it is reasoning.
    inside = '<think><tool_call>{"name": "f", "arguments": {}}</tool_call></think>Done.'
    make = parser_factory(ToolPlan(ToolMode.AUTO, []), tool_parser="hermes", reasoning_parser="qwen3")
    message = check_every_split(make, inside)
    assert message["tool_calls"] is None and message["content"] == "Done."


def test_factory_picks_parsers():
    auto, none = ToolPlan(ToolMode.AUTO, []), ToolPlan(ToolMode.NONE, None)
    assert parser_factory(none, tool_parser=None, reasoning_parser=None) is PlainText
    assert parser_factory(none, tool_parser="hermes", reasoning_parser=None) is PlainText  # none: nothing parsed
    assert isinstance(parser_factory(auto, tool_parser="hermes", reasoning_parser=None)(), HermesParser)
    assert isinstance(parser_factory(auto, tool_parser="hermes", reasoning_parser="qwen3")(), ReasoningThenTools)
    named = ToolPlan(ToolMode.NAMED, [], function_name="f", schema={})
    assert isinstance(parser_factory(named, tool_parser=None, reasoning_parser="deepseek_r1")(), NamedCall)
    required = ToolPlan(ToolMode.REQUIRED, [], schema={})
    assert isinstance(parser_factory(required, tool_parser=None, reasoning_parser=None)(), RequiredCalls)


def test_kimi_thinking_then_its_calls_without_a_closing_tag():
    text = ("I need the weather.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>')
    make = parser_factory(ToolPlan(ToolMode.AUTO, []), tool_parser="kimi_k2", reasoning_parser="kimi_k2")
    message = check_every_split(make, text)
    assert message["reasoning_content"] == "I need the weather." and message["content"] is None
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("functions.get_weather:0", "get_weather", '{"city": "Oslo"}')]


def test_a_template_switch_turns_a_formats_thinking_off():
    """Kimi K2's `thinking` (on unless false) and DeepSeek V3.1's (off unless true), read from chat_template_kwargs
    as vLLM reads them: switched off, the request's output is all content (generation_plan drops the parser)."""
    from rill.asgi.parsers.reasoning import thinking_switched_off

    assert not thinking_switched_off("kimi_k2", {}) and thinking_switched_off("kimi_k2", {"thinking": False})
    assert thinking_switched_off("deepseek_v3", {}) and not thinking_switched_off("deepseek_v3", {"thinking": True})
    assert not thinking_switched_off("qwen3", {"enable_thinking": False, "thinking": False})  # its output says
    assert not thinking_switched_off(None, {"thinking": False})
    message = check_every_split(REASONING_PARSERS["deepseek_v3"], "Weigh it.</think>Paris.")
    assert (message["reasoning_content"], message["content"]) == ("Weigh it.", "Paris.")
