"""Request bounds as pure units: the nesting bound, logit_bias keys, per-field bounds, prompts x n,
and parallel_tool_calls false keeping the first call (issue 30)."""
from __future__ import annotations

import json

import msgspec
import pytest

from rill.asgi.errors import APIError
from rill.asgi.parsers.chat_parsing import parser_factory
from rill.asgi.requests import nesting
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.bounds import MAX_CHOICES, MAX_PROMPTS
from rill.asgi.requests.messages_request import chat_request as messages_chat_request
from rill.asgi.requests.messages_request import messages_decoder
from rill.asgi.requests.responses_input import chat_request as responses_chat_request
from rill.asgi.requests.responses_input import input_items, items_to_messages
from rill.asgi.requests.responses_request import responses_decoder
from rill.asgi.requests.sampling import logit_bias
from rill.asgi.requests.schemas import chat_decoder, check_choices, prompt_batch
from rill.asgi.requests.tool_choice import ToolMode, plan_tools
from rill.asgi.routes.lora_admin import _load_decoder, _unload_decoder
from tests.helpers.parser_checks import run

DEPTH = nesting.MAX_DEPTH
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def error_of(fn, *args) -> APIError:
    with pytest.raises(APIError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value


def test_json_text_is_parsed_up_to_the_bound_and_refused_past_it():
    assert nesting.loads(nested(DEPTH)) is not None
    for text in (nested(DEPTH + 1), nested(10_000), '{"a": ' * 2000 + "1" + "}" * 2000):
        with pytest.raises(nesting.TooDeep):
            nesting.loads(text)
    with pytest.raises(ValueError) as info:
        nesting.loads("{not json")
    assert not isinstance(info.value, nesting.TooDeep)


def body(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}).encode()


def test_a_free_form_field_nested_too_deep_is_a_400_naming_it():
    deep = json.loads(nested(DEPTH + 1))
    cases = {
        "chat_template_kwargs": {"chat_template_kwargs": {"x": deep}},
        "tools[0].function.parameters": {"tools": [{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": {"type": "object", "x": deep}}}]},
        "guided_json": {"guided_json": {"x": deep}},
        "response_format": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}},
    }
    for param, fields in cases.items():
        assert error_of(decode_json, chat_decoder, body(**fields)).param == param
    # At the bound it decodes.
    decode_json(chat_decoder, body(chat_template_kwargs={"x": json.loads(nested(DEPTH - 1))}))


def test_logit_bias_keys_that_are_not_token_ids_are_400s():
    for key in ("--5", "+5", " 5", "1_0", "5 ", "1" * 5000, "٣", ""):
        assert error_of(logit_bias, {key: 1.0}, 100).param == "logit_bias"
    assert logit_bias({"5": 1.0, "99": -2.0}, 100) == {5: 1.0, 99: -2.0}
    assert error_of(logit_bias, {"-1": 1.0}, 100).param == "logit_bias"


@pytest.mark.parametrize("param, fields", [
    ("messages", {"messages": [{"role": "user", "content": "x"}] * 4097}),
    ("stop", {"stop": ["x"] * 17}),
    ("stop", {"stop": "x" * 1025}),
    ("stop_token_ids", {"stop_token_ids": list(range(65))}),
    ("logit_bias", {"logit_bias": {str(i): 1 for i in range(1025)}}),
    ("tools", {"tools": [TOOL] * 129}),
    ("user", {"user": "u" * 257}),
    ("chat_template_kwargs", {"chat_template_kwargs": {f"k{i}": 1 for i in range(65)}}),
    ("nvext.annotations", {"nvext": {"annotations": ["timing"] * 17}}),
    ("tool_choice", {"tool_choice": "a" * 257}),
])
def test_chat_fields_past_their_bound_are_400s_naming_them(param, fields):
    assert error_of(decode_json, chat_decoder, body(**fields)).param == param


def test_message_fields_past_their_bound_are_400s_naming_them():
    call = {"id": "c" * 257, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]}]
    assert error_of(decode_json, chat_decoder, body(messages=messages)).param == "messages[1].tool_calls[0].id"
    messages = [{"role": "user" * 100, "content": "Hi"}]
    assert error_of(decode_json, chat_decoder, body(messages=messages)).param == "messages[0].role"
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}] * 1025}]
    assert error_of(decode_json, chat_decoder, body(messages=messages)).param == "messages[0].content"


def test_responses_and_messages_bounds():
    resp = {"model": "m", "input": [{"role": "user", "content": "x"}] * 4097}
    assert error_of(decode_json, responses_decoder, json.dumps(resp).encode()).param == "input"
    resp = {"model": "m", "input": "x", "include": ["message.output_text.logprobs"] * 17}
    assert error_of(decode_json, responses_decoder, json.dumps(resp).encode()).param == "include"
    msgs = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["s"] * 17}
    assert error_of(decode_json, messages_decoder, json.dumps(msgs).encode()).param == "stop_sequences"


def test_lora_admin_names_and_paths_are_bounded():
    load = {"lora_name": "a" * 257, "lora_path": "/x"}
    assert error_of(decode_json, _load_decoder, json.dumps(load).encode()).param == "lora_name"
    load = {"lora_name": "a", "lora_path": "/" + "x" * 4096}
    assert error_of(decode_json, _load_decoder, json.dumps(load).encode()).param == "lora_path"
    assert error_of(decode_json, _unload_decoder, json.dumps({"lora_name": "a" * 257}).encode()).param == "lora_name"


def test_prompts_and_choices_are_capped_before_any_work():
    assert error_of(prompt_batch, ["x"] * (MAX_PROMPTS + 1)).param == "prompt"
    assert error_of(prompt_batch, [[1]] * (MAX_PROMPTS + 1), "input").param == "input"
    assert prompt_batch(list(range(5000))) == [list(range(5000))]  # one token-id prompt: the context bounds it
    check_choices(MAX_PROMPTS, 1)
    check_choices(MAX_CHOICES // 128, 128)
    assert error_of(check_choices, MAX_CHOICES // 128 + 1, 128).param == "n"


def auto_plan(req):
    return plan_tools(req, parser_name="hermes", auto_enabled=True)


def chat_calls(plan) -> list[str]:
    message, called, _ = run(parser_factory(plan, tool_parser="hermes", reasoning_parser=None), TWO_CALLS,
                             cuts=range(3, len(TWO_CALLS), 7))
    assert called and message["content"] == "Let me check.\n"
    return [call["function"]["name"] for call in message["tool_calls"]]


def test_parallel_tool_calls_false_keeps_the_first_call_in_chat():
    req = decode_json(chat_decoder, body(tools=[TOOL], tool_choice="auto", parallel_tool_calls=False))
    plan = auto_plan(req)
    assert plan.mode is ToolMode.AUTO and plan.max_calls == 1
    assert chat_calls(plan) == ["get_weather"]
    for parallel in (True, None):
        fields = {"parallel_tool_calls": parallel} if parallel is not None else {}
        assert chat_calls(auto_plan(decode_json(chat_decoder, body(tools=[TOOL], **fields)))) == \
            ["get_weather", "get_time"]


def test_parallel_tool_calls_false_reaches_the_plan_from_responses_and_messages():
    resp = msgspec.json.decode(json.dumps({"model": "m", "input": "Hi", "parallel_tool_calls": False, "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}).encode(), type=responses_decoder.type)
    chat = responses_chat_request(resp, items_to_messages(input_items(resp)))
    assert chat_calls(auto_plan(chat)) == ["get_weather"]
    msgs = msgspec.json.decode(json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
                                           "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                                           "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}).encode(),
                               type=messages_decoder.type)
    assert chat_calls(auto_plan(messages_chat_request(msgs))) == ["get_weather"]


def test_constraints_compile_off_the_event_loop(monkeypatch):
    """A schema at the 64 KiB bound can take a second to check: load_checker does it on a thread
    (xgrammar releases the GIL), and the route's later check finds it in the cache."""
    import asyncio
    import threading

    import rill.asgi.requests.structured as structured

    threads = []
    monkeypatch.setattr(structured, "_grammar_error",
                        lambda kind, value: threads.append(threading.current_thread() is threading.main_thread()))
    req = decode_json(chat_decoder, body(guided_regex="a+"))
    asyncio.run(structured.load_checker(req, forced_schema={"type": "object"}, text_format={"type": "json_object"}))
    assert threads == [False, False]  # the regex and the forced schema; json_object needs no compile
    asyncio.run(structured.load_checker(decode_json(chat_decoder, body())))
    assert threads == [False, False]  # nothing to compile
