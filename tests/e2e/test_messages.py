"""Anthropic's Messages API (text, the errors) with Anthropic's own SDK as the client, on the
shared server; tools, thinking and the ping keep-alive are tests/e2e/test_messages_tools.py's.

The SDK (2.x) no longer has sampling parameters; greedy decoding for comparisons is asked
through `extra_body` (the server takes `temperature`, `top_p` and `top_k` as the API had them).
Every stream is checked by the event-grammar checker (tests/helpers/messages_events.py)."""
from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.helpers.http_calls import MODEL
from tests.helpers.messages_events import GREEDY, blocks, parse_sse, sdk_stream, stream_text

ASK = [{"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", _strict_response_validation=True)


def test_create_and_its_stream_agree(claude, server):
    kwargs = dict(model=MODEL, max_tokens=24, messages=ASK, system="You are terse.", **GREEDY)
    message = claude.messages.create(**kwargs)
    assert message.role == "assistant" and message.type == "message" and message.id.startswith("msg_")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens > 0 and message.usage.input_tokens + message.usage.cache_read_input_tokens > 10
    final = sdk_stream(claude, server, {"max_tokens": 24, "messages": ASK, "system": "You are terse."})
    assert blocks(final) == blocks(message)
    assert final.stop_reason == message.stop_reason and final.usage.output_tokens == message.usage.output_tokens
    # the raw events: message_start, one text block (start, text deltas, stop), message_delta, message_stop
    events = parse_sse(stream_text(server, {"max_tokens": 24, "messages": ASK, "system": "You are terse.",
                                            "temperature": 0}))
    assert [name for name, _ in events][:2] == ["message_start", "content_block_start"]
    assert {name for name, _ in events} == {"message_start", "content_block_start", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop"}


def test_max_tokens_and_stop_sequences(claude, server):
    full = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK, **GREEDY).content[0].text
    short = claude.messages.create(model=MODEL, max_tokens=2, messages=ASK, **GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    word = full.split()[3]
    stopped = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK, stop_sequences=[word], **GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert word not in stopped.content[0].text and full.startswith(stopped.content[0].text)
    final = sdk_stream(claude, server, {"max_tokens": 40, "messages": ASK, "stop_sequences": [word]})
    assert blocks(final) == blocks(stopped) and final.stop_sequence == word


def test_a_server_without_a_tool_parser(claude, server):
    """Forced tool choices need no parser (the grammar writes the call); auto needs one."""
    tools = [{"name": "pick", "input_schema": {"type": "object", "properties": {
        "color": {"type": "string", "enum": ["red", "blue"]}}, "required": ["color"], "additionalProperties": False}}]
    message = claude.messages.create(model=MODEL, max_tokens=20, messages=ASK, tools=tools,
                                     tool_choice={"type": "tool", "name": "pick"}, **GREEDY)
    [block] = message.content
    assert block.type == "tool_use" and block.name == "pick" and block.input["color"] in ("red", "blue")
    assert message.stop_reason == "tool_use" and block.id.startswith("toolu_")
    final = sdk_stream(claude, server, {"max_tokens": 20, "messages": ASK, "tools": tools,
                                        "tool_choice": {"type": "tool", "name": "pick"}})
    assert final.content[0].input == block.input
    none = claude.messages.create(model=MODEL, max_tokens=3, messages=ASK, tools=tools, tool_choice={"type": "none"})
    assert none.content[0].type == "text"
    with pytest.raises(anthropic.BadRequestError, match="enable-auto-tool-choice"):
        claude.messages.create(model=MODEL, max_tokens=3, messages=ASK, tools=tools)  # auto, the default


def test_count_tokens_matches_the_prompt(claude):
    counted = claude.messages.count_tokens(model=MODEL, messages=ASK, system="You are terse.")
    made = claude.messages.create(model=MODEL, max_tokens=1, messages=ASK, system="You are terse.")
    assert counted.input_tokens == made.usage.input_tokens + made.usage.cache_read_input_tokens
    thinking = {"type": "enabled", "budget_tokens": 1024}
    assert claude.messages.count_tokens(model=MODEL, messages=ASK, system="You are terse.",
                                        thinking=thinking).input_tokens == counted.input_tokens


def test_a_final_assistant_turn_is_continued(claude, server):
    """Anthropic's prefill: the answer takes up where a final assistant turn of text ends (chat's
    continue_final_message gives the same tokens), and holds only what follows it; count_tokens counts that
    prompt. An empty final turn is left out; trailing whitespace and thinking are 400s, as Anthropic's."""
    start = "The sea is"
    prefilled = [*ASK, {"role": "assistant", "content": [{"type": "text", "text": start}]}]
    message = claude.messages.create(model=MODEL, max_tokens=12, messages=prefilled, **GREEDY)
    chat = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [*ASK, {"role": "assistant", "content": start}], "max_tokens": 12,
        "temperature": 0, "continue_final_message": True, "add_generation_prompt": False}).json()
    [block] = message.content
    assert block.text == chat["choices"][0]["message"]["content"] and block.text
    assert not block.text.lstrip().startswith(start)
    fresh = claude.messages.create(model=MODEL, max_tokens=12, messages=ASK, **GREEDY)
    assert block.text != fresh.content[0].text
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == \
        claude.messages.count_tokens(model=MODEL, messages=prefilled).input_tokens == chat["usage"]["prompt_tokens"]
    assert blocks(sdk_stream(claude, server, {"max_tokens": 12, "messages": prefilled})) == blocks(message)
    empty = claude.messages.create(model=MODEL, max_tokens=12, messages=[*ASK, {"role": "assistant", "content": ""}],
                                   **GREEDY)
    assert blocks(empty) == blocks(fresh)
    for text, extra in (("The sea is ", {}), (start, {"thinking": {"type": "enabled", "budget_tokens": 1024}})):
        r = httpx.post(f"{server.base_url}/v1/messages", timeout=60, json={
            "model": MODEL, "max_tokens": 2000, "messages": [*ASK, {"role": "assistant", "content": text}], **extra})
        assert r.status_code == 400 and "`messages[1].content`" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("body, status, kind", [
    ({"messages": ASK}, 400, "invalid_request_error"),  # max_tokens is required
    ({"max_tokens": 5, "messages": ASK, "tools": [{"name": "f", "input_schema": {}}]}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": ASK, "service_tier": "auto"}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": ASK, "temperature": 1.5}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": ASK, "model": "claude-nope"}, 404, "not_found_error"),
    ({"max_tokens": 5, "messages": ["hi"]}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [5]}]}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": [{"role": "user"}]}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": ASK, "system": 5}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": ASK, "stop_sequences": [""]}, 400, "invalid_request_error"),
    ({"max_tokens": 10**6, "messages": ASK}, 400, "invalid_request_error"),
    ({"max_tokens": 0, "messages": ASK}, 400, "invalid_request_error"),
])
def test_errors_take_anthropics_shape(server, body, status, kind):
    r = httpx.post(f"{server.base_url}/v1/messages", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == kind and error["error"]["message"]


@pytest.mark.parametrize("body, field", [
    ({"tools": [{"input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "g"}},
     "tool_choice.name"),
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking.budget_tokens"),  # not below max_tokens
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages[0].content[0].source.type"),
    ({"messages": [ASK[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                              "input": []}]}]}, "messages[1].content[0].input"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages[0].content[0].tool_use_id"),
])
def test_bad_tools_and_blocks_name_the_field(server, body, field):
    r = httpx.post(f"{server.base_url}/v1/messages", json={"model": MODEL, "max_tokens": 2000, "messages": ASK, **body},
                   timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert f"`{field}`" in error["error"]["message"], error["error"]["message"]
    if "thinking" not in body:  # count_tokens checks what builds the prompt as create does
        r = httpx.post(f"{server.base_url}/v1/messages/count_tokens", json={"model": MODEL, "messages": ASK, **body},
                       timeout=60)
        assert r.status_code == 400 and f"`{field}`" in r.json()["error"]["message"], r.text


def test_the_sdk_raises_its_own_errors(claude):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=ASK, tools=[{"name": "f", "input_schema": {}}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-nope", max_tokens=5, messages=ASK)


CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"], "additionalProperties": False}


def test_structured_outputs_and_effort(claude, server):
    """`output_config.format` (Anthropic's structured outputs; the beta's `output_format` too): the text is JSON that
    follows the schema, through the grammar engine as chat's. `output_config.effort` is taken (with a reasoning parser
    it is a thinking budget, as chat's reasoning_effort). Each bad value is a 400 naming its field."""
    import json

    config = {"format": {"type": "json_schema", "schema": CITY}, "effort": "low"}
    message = claude.messages.create(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "A city?"}],
                                     output_config=config, **GREEDY)
    assert json.loads(message.content[0].text)["city"] in ("Paris", "Rome", "Oslo")
    assert message.stop_reason == "end_turn"  # the grammar ended it
    final = sdk_stream(claude, server, {"max_tokens": 40, "messages": [{"role": "user", "content": "A city?"}],
                                        "output_config": config})
    assert blocks(final) == blocks(message)
    url = f"{server.base_url}/v1/messages"
    beta = httpx.post(url, json={"model": MODEL, "max_tokens": 40, "messages": ASK, "temperature": 0,
                                 "output_format": {"type": "json_schema", "schema": CITY}}, timeout=60).json()
    assert set(json.loads(beta["content"][0]["text"])) == {"city"}
    for extra, field in [({"output_config": {"effort": "huge"}}, "output_config.effort"),
                         ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
                         ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "bogus"}}}},
                          "output_config.format.schema"),
                         ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
                         ({"output_format": {"type": "json_schema", "schema": CITY},
                           "output_config": {"format": {"type": "json_schema", "schema": CITY}}}, "output_format")]:
        r = httpx.post(url, json={"model": MODEL, "max_tokens": 40, "messages": ASK, **extra}, timeout=60)
        assert r.status_code == 400 and f"`{field}" in r.json()["error"]["message"], (extra, r.text)
    counted = httpx.post(f"{url}/count_tokens", json={"model": MODEL, "messages": ASK, "output_config": config},
                         timeout=60)
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
