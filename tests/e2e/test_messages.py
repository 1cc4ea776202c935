"""Anthropic's Messages API (first slice: text) with Anthropic's own SDK as the client.

The SDK (2.x) no longer has sampling parameters; greedy decoding for comparisons is asked
through `extra_body` (the server takes `temperature`, `top_p` and `top_k` as the API had them)."""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Write one sentence about the sea."}]
GREEDY = {"extra_body": {"temperature": 0}}
EVENT_ORDER = ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
               "message_stop"]


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", _strict_response_validation=True)


def raw_events(server, body: dict) -> list[tuple[str, dict]]:
    events = []
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append((name, data))
    return events


def test_create_and_its_stream_agree(claude, server):
    kwargs = dict(model=MODEL, max_tokens=24, messages=ASK, system="You are terse.", **GREEDY)
    message = claude.messages.create(**kwargs)
    assert message.role == "assistant" and message.type == "message" and message.id.startswith("msg_")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens > 0 and message.usage.input_tokens + message.usage.cache_read_input_tokens > 10
    with claude.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == message.content[0].text
    assert streamed.stop_reason == message.stop_reason and streamed.usage.output_tokens == message.usage.output_tokens
    events = raw_events(server, {"model": MODEL, "max_tokens": 24, "messages": ASK, "system": "You are terse.",
                                 "temperature": 0})
    names = [name for name, _ in events]
    collapsed = [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]]
    assert collapsed == EVENT_ORDER
    text = "".join(e["delta"]["text"] for name, e in events if name == "content_block_delta")
    assert text == message.content[0].text
    assert events[-2][1]["delta"]["stop_reason"] == message.stop_reason


def test_max_tokens_and_stop_sequences(claude):
    full = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK, **GREEDY).content[0].text
    short = claude.messages.create(model=MODEL, max_tokens=2, messages=ASK, **GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    word = full.split()[3]
    stopped = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK, stop_sequences=[word], **GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert word not in stopped.content[0].text and full.startswith(stopped.content[0].text)


def test_count_tokens_matches_the_prompt(claude):
    counted = claude.messages.count_tokens(model=MODEL, messages=ASK, system="You are terse.")
    made = claude.messages.create(model=MODEL, max_tokens=1, messages=ASK, system="You are terse.")
    assert counted.input_tokens == made.usage.input_tokens + made.usage.cache_read_input_tokens


@pytest.mark.parametrize("body, status, kind", [
    ({"messages": ASK}, 400, "invalid_request_error"),  # max_tokens is required
    ({"max_tokens": 5, "messages": ASK, "tools": [{"name": "f", "input_schema": {}}]}, 400, "invalid_request_error"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400, "invalid_request_error"),
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


def test_the_sdk_raises_its_own_errors(claude):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=ASK, tools=[{"name": "f", "input_schema": {}}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-nope", max_tokens=5, messages=ASK)
