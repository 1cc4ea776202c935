"""A Messages request as chat's request: tools, tool_choice, thinking and tool turns, and the 400s naming the field (no server)."""
from __future__ import annotations

import json

import pytest

from rill.asgi.errors import APIError
from rill.asgi.prompt.chat_messages import render_prompt
from rill.asgi.prompt.templating import ChatTemplate
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.messages_request import chat_request, count_request, count_tokens_decoder, messages_decoder
from rill.asgi.requests.tool_choice import ToolMode, plan_tools
from tests.helpers.conversations import CONVERSATION, TOOL_TEMPLATE, TOOLS, render, state_with

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "input_schema": {"type": "object"}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
# CONVERSATION (tests/unit/test_chat_messages.py) in Anthropic's terms.
TURNS = [{"role": "user", "content": [{"type": "text", "text": "Weather\nin Paris?"}]},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                            "input": {"city": "Paris"}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                       "content": [{"type": "text", "text": "22 C"}]}]}]


def create(**fields):
    body = {"model": "m", "max_tokens": 2000, "messages": USER, **fields}
    return chat_request(decode_json(messages_decoder, json.dumps(body).encode()))


def counted(**fields):
    body = {"model": "m", "messages": USER, **fields}
    return count_request(decode_json(count_tokens_decoder, json.dumps(body).encode()))


def plan(chat):
    return plan_tools(chat, parser_name="hermes", auto_enabled=True)


def test_tool_turns_render_as_chats_do():
    state = state_with(ChatTemplate.from_string(TOOL_TEMPLATE))
    tools = [{"name": t["function"]["name"], "input_schema": {"type": "object"}} for t in TOOLS]
    chat_tools = [{"type": "function", "function": {"name": t["function"]["name"],
                                                     "parameters": {"type": "object"}}} for t in TOOLS]
    mine = render_prompt(state, counted(system="Use tools.", messages=TURNS, tools=tools))
    assert mine == render(state, messages=CONVERSATION, tools=chat_tools)
    assert '<tool_response id="call_1">22 C</tool_response>' in mine and "[city=Paris]" in mine
    # create and count_tokens build one prompt
    assert render_prompt(state, create(system="Use tools.", messages=TURNS, tools=tools)) == mine


def test_thinking_blocks_errors_and_text_after_results():
    state = state_with(ChatTemplate.from_string(
        "{% for m in messages %}{{ m.role }}:{{ m.reasoning }}|{{ m.content }};{% endfor %}"))
    turns = [USER[0], {"role": "assistant", "content": [
                 {"type": "thinking", "thinking": "Look it up.", "signature": "x"},
                 {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "Checking."},
                 {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "no such city",
                                           "is_error": True}, {"type": "text", "text": "Try Rome."}]}]
    assert render_prompt(state, counted(messages=turns)) == \
        "user:|Weather in Paris?;assistant:Look it up.|Checking.;tool:|Error: no such city;user:|Try Rome.;"


@pytest.mark.parametrize("choice, mode, name", [
    ({"type": "auto"}, ToolMode.AUTO, None), ({"type": "any"}, ToolMode.REQUIRED, None),
    ({"type": "tool", "name": "get_time"}, ToolMode.NAMED, "get_time"), ({"type": "none"}, ToolMode.NONE, None),
    (None, ToolMode.AUTO, None),
])
def test_tool_choice_maps_onto_chats(choice, mode, name):
    fields = {"tools": [WEATHER, TIME]} | ({"tool_choice": choice} if choice else {})
    got = plan(create(**fields))
    assert (got.mode, got.function_name) == (mode, name)
    assert got.tools[0] == {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                             "parameters": WEATHER["input_schema"]}}


def test_disable_parallel_tool_use_and_thinking():
    one = plan(create(tools=[WEATHER, TIME], tool_choice={"type": "any", "disable_parallel_tool_use": True}))
    assert one.schema["maxItems"] == 1
    assert plan(create(tool_choice={"type": "auto"})).mode is ToolMode.NONE  # auto with no tools: plain text
    assert create(thinking={"type": "enabled", "budget_tokens": 1024}).chat_template_kwargs == {"enable_thinking": True}
    assert create(thinking={"type": "disabled"}).chat_template_kwargs == {"enable_thinking": False}
    assert create(thinking={"type": "adaptive"}).chat_template_kwargs == {"enable_thinking": True}
    assert create().chat_template_kwargs is None  # the template's own default
    assert counted(thinking={"type": "enabled", "budget_tokens": 5000}).chat_template_kwargs  # no max_tokens to pass


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tools": [{"name": "a b", "input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tools": [WEATHER, {"name": "get_weather", "input_schema": {"type": "object"}}]}, "tools[1].name"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": {}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": "object"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": "f"}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1023}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, "thinking.budget_tokens"),  # not < max_tokens
    ({"thinking": {"type": "on"}}, "thinking.type"),
    ({"thinking": {"type": "adaptive"}, "tools": [WEATHER], "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "search_result"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages[0].content[0].source"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}]}, "messages[0].content[0].source.type"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": 7}}]}]},
     "messages[0].content[0].source.data"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"},
                                                 "citations": {"enabled": True}}]}]}, "messages[0].content[0].citations"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "content", "content": [{"type": "image"}]}}]}]}, "messages[0].content[0].source.content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [USER[0], {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]},
     "messages[1].content[0].type"),
    ({"messages": [USER[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]},
     "messages[1].content[0].input"),
    ({"messages": [USER[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                               "input": "{}"}]}]}, "messages[1].content[0].input"),
    ({"messages": [USER[0], {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]},
     "messages[1].content[0].id"),
    ({"messages": [USER[0], {"role": "assistant", "content": [{"type": "thinking"}]}]},
     "messages[1].content[0].thinking"),
    ({"messages": [*TURNS[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_9"}]}]},
     "messages[2].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [*TURNS[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "image"}]}]}]},
     "messages[2].content[0].content[0].type"),
    ({"messages": [*TURNS[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "is_error": "yes"}]}]}, "messages[2].content[0].is_error"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"service_tier": "auto"}, "service_tier"),
])
def test_bad_requests_name_the_field(fields, param):
    with pytest.raises(APIError) as info:
        create(**fields)
    assert info.value.status == 400 and info.value.param == param, info.value.message
    assert f"`{param}`" in info.value.message or f"$.{param}" in info.value.message


def test_text_documents_become_the_turns_text_in_their_place():
    """A document of text (a text or content source) is text of its turn, in order, with its title and context."""
    blocks = [{"type": "text", "text": "Summarise:"},
              {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Tides rise."},
               "title": "notes.txt", "context": "From the harbour log"},
              {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "Ships dock."}]}},
              {"type": "text", "text": "Thanks."}]
    chat = create(messages=[{"role": "user", "content": blocks}])
    (message,) = chat.messages
    assert message.content == ("Summarise:<document>\n<source>notes.txt</source>\n<context>From the harbour log</context>\n"
                               "<document_content>\nTides rise.\n</document_content>\n</document>\n<document>\n"
                               "<document_content>\nShips dock.\n</document_content>\n</document>\nThanks.")
