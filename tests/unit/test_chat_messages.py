"""Chat messages, tools and tool_choice as the chat template and the engine get them (no server)."""
from __future__ import annotations

import json

import msgspec
import pytest

from rill.asgi.errors import APIError, from_validation_error
from rill.asgi.prompt.templating import ChatTemplate
from rill.asgi.requests.tool_choice import ToolMode, plan_tools
from tests.helpers.conversations import CONVERSATION, TOOL_TEMPLATE, TOOLS, render, request, state_with


def decode_param(**fields) -> str | None:
    """The `param` of the 400 that decoding these fields gives."""
    with pytest.raises(msgspec.ValidationError) as info:
        request(**fields)
    return from_validation_error(info.value).param


def rejected(call, param: str) -> APIError:
    with pytest.raises(APIError) as info:
        call()
    assert info.value.status == 400 and info.value.param == param, info.value.message
    return info.value


def test_tools_and_tool_messages_render_as_hf_would(model_dir):
    from transformers import AutoTokenizer

    prompt = render(state_with(ChatTemplate.from_string(TOOL_TEMPLATE)), messages=CONVERSATION, tools=TOOLS)
    # HF's apply_chat_template with what vLLM hands it: developer as system for a template that
    # never names it, parts joined by newlines, null content as "", arguments as a dict.
    hf_messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather\nin Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]
    expected = AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(
        hf_messages, tools=TOOLS, chat_template=TOOL_TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert prompt == expected
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}} [city=Paris]' in prompt
    assert '<tool_response id="call_1">22 C</tool_response>' in prompt
    assert json.dumps(TOOLS[0]) in prompt


def test_bundled_chatml_developer_role_and_null_arguments(model_dir):
    state = state_with(ChatTemplate(model_dir))
    prompt = render(state, messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    kept = state_with(ChatTemplate.from_string("{% for m in messages %}{{ m.role }}{% endfor %}{# developer #}"))
    assert render(kept, messages=[{"role": "developer", "content": "x"}]) == "developer"
    odd = [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f"}},
                                                {"id": "b", "type": "function",
                                                 "function": {"name": "g", "arguments": "not json"}}]}]
    args = state_with(ChatTemplate.from_string(
        "{% for tc in messages[0].tool_calls %}{{ tc.function.arguments | tojson }};{% endfor %}"))
    assert render(args, messages=odd) == "{};{};"
    thinking = state_with(ChatTemplate.from_string("{% for m in messages %}{{ m.reasoning_content }}|"
                                                   "{{ m.reasoning }};{% endfor %}"))
    assert render(thinking, messages=[{"role": "assistant", "content": "4", "reasoning_content": "2+2"},
                                      {"role": "assistant", "content": "5", "reasoning": "2+3"}]) == "2+2|2+2;2+3|2+3;"


def test_bad_messages_name_the_field(model_dir):
    state = state_with(ChatTemplate(model_dir))
    rejected(lambda: render(state, messages=[{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]),
             "messages[1].role")
    rejected(lambda: render(state, messages=[{"role": "tool", "content": "22 C"}]), "messages[0].tool_call_id")
    rejected(lambda: render(state, messages=[{"role": "assistant", "tool_calls": [
        {"id": "a", "type": "custom", "function": {"name": "f"}}]}]), "messages[0].tool_calls[0].type")
    assert decode_param(messages=[{"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}]) \
        == "messages[0].tool_calls[0].function"
    for key in ("tools", "add_generation_prompt", "chat_template"):
        rejected(lambda: render(state, messages=[{"role": "user", "content": "a"}], chat_template_kwargs={key: 1}),
                 "chat_template_kwargs")


def test_continue_final_message(model_dir):
    from transformers import AutoTokenizer

    state = state_with(ChatTemplate(model_dir))
    messages = [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}]
    prompt = render(state, messages=messages, continue_final_message=True)
    assert prompt.endswith("<|im_start|>assistant\nOne, two,")
    expected = AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    assert prompt == expected
    assert render(state, messages=messages, continue_final_message=True, add_generation_prompt=False) == prompt
    rejected(lambda: render(state, messages=messages, continue_final_message=True, add_generation_prompt=True),
             "continue_final_message")
    rejected(lambda: render(state, messages=[{"role": "assistant", "content": ""}], continue_final_message=True),
             "messages")
    # Without it, the same messages end with the end of turn and a new assistant turn.
    assert render(state, messages=messages).endswith("One, two,<|im_end|>\n<|im_start|>assistant\n")


def test_request_chat_template_only_when_trusted(model_dir):
    mine = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{{ eos_token }}"
    messages = [{"role": "user", "content": "Hi"}]
    rejected(lambda: render(state_with(ChatTemplate(model_dir)), messages=messages, chat_template=mine),
             "chat_template")
    trusted = state_with(ChatTemplate(model_dir), trust=True)
    assert render(trusted, messages=messages, chat_template=mine) == "[user:Hi]<|im_end|>"
    rejected(lambda: render(trusted, messages=messages, chat_template="{% for %}"), "chat_template")
    rejected(lambda: render(trusted, messages=messages, chat_template="{{ raise_exception('no') }}"),
             "chat_template")
    # The sandbox holds for a request's template too.
    rejected(lambda: render(trusted, messages=messages, chat_template="{{ ''.__class__.__mro__ }}"),
             "chat_template")


def plan(**fields):
    auto = fields.pop("auto", True)
    return plan_tools(request(messages=[{"role": "user", "content": "x"}], **fields),
                      parser_name="hermes" if auto else None, auto_enabled=auto)


def test_tool_choice_modes():
    assert plan().mode is ToolMode.NONE and plan().tools is None
    assert plan(tools=TOOLS).mode is ToolMode.AUTO  # no tool_choice with tools: auto, as vLLM
    none = plan(tools=TOOLS, tool_choice="none")
    assert none.mode is ToolMode.NONE and none.tools == TOOLS  # the template still sees the tools
    named = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}, auto=False)
    assert named.mode is ToolMode.NAMED and named.function_name == "get_weather"
    assert named.schema == TOOLS[0]["function"]["parameters"]
    bare = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}, auto=False)
    assert bare.schema == {"type": "object", "properties": {}}
    required = plan(tools=TOOLS, tool_choice="required", auto=False)
    assert required.mode is ToolMode.REQUIRED
    items = required.schema["items"]["anyOf"]
    assert [i["properties"]["name"]["enum"] for i in items] == [["get_weather"], ["get_time"]]
    assert items[0]["properties"]["parameters"] == TOOLS[0]["function"]["parameters"]
    assert required.schema["minItems"] == 1 and "maxItems" not in required.schema
    assert plan(tools=TOOLS, tool_choice="required", parallel_tool_calls=False).schema["maxItems"] == 1
    assert plan(tools=[], tool_choice="required").mode is ToolMode.NONE  # as OpenAI


def test_tool_choice_refusals():
    rejected(lambda: plan(tools=TOOLS, auto=False), "tool_choice")  # auto needs the flags
    rejected(lambda: plan(tools=TOOLS, tool_choice="auto", auto=False), "tool_choice")
    rejected(lambda: plan(tool_choice="required"), "tool_choice")
    rejected(lambda: plan(tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice")
    rejected(lambda: plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
             "tool_choice")
    rejected(lambda: plan(tools=TOOLS, tool_choice="sometimes"), "tool_choice")
    rejected(lambda: plan(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools[0].type")
    rejected(lambda: plan(tools=[{"type": "function"}]), "tools[0].function")
    assert decode_param(messages=[{"role": "user", "content": "x"}],
                        tools=[{"type": "function", "function": {"description": "no name"}}]) == "tools[0].function.name"
    assert decode_param(messages=[{"role": "user", "content": "x"}], tool_choice=3) == "tool_choice"


def test_required_lifts_defs():
    with_defs = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}}}
    schema = plan(tools=[with_defs, TOOLS[1]], tool_choice="required").schema
    assert schema["$defs"] == {"P": {"type": "integer"}}
    assert "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]
    clash = {"type": "function", "function": {"name": "g", "parameters": {"$defs": {"P": {"type": "string"}}}}}
    rejected(lambda: plan(tools=[with_defs, clash], tool_choice="required"), "tools")
    odd = {"type": "function", "function": {"name": "h", "parameters": {"$defs": 3}}}
    assert "$defs" not in plan(tools=[odd], tool_choice="required").schema
