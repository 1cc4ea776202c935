"""The Responses API on a server with other flags: two API workers sharing a store of 2 entries
(the bound holds across them), keep-alives, a reasoning parser."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers.responses_events import check_stream, parse_sse
from tests.helpers.server import start_server, stop_server

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def flagged(model_dir, tmp_path_factory):
    # kimi_k2 (as deepseek_r1) takes text up to `</think>` as reasoning, and all of it when no tag comes: this
    # model never writes one, so every output is reasoning, unless `thinking: false` switches it off. A 10 ms
    # keep-alive fires between tokens.
    srv = start_server(tmp_path_factory, "--max-model-len", "1024", "--responses-store-max-entries", "2",
                       "--conversations-store-max-entries", "1", "--sse-keepalive", "0.01",
                       "--reasoning-parser", "kimi_k2", "--workers", "2")
    yield srv
    stop_server(srv)


def create(srv, **body) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/v1/responses", json={"model": MODEL, "max_output_tokens": 4, **body},
                      timeout=60)


def test_store_keeps_the_newest_two(flagged):
    ids = [create(flagged, input=f"hi {i}").json()["id"] for i in range(3)]
    gone = httpx.get(f"{flagged.base_url}/v1/responses/{ids[0]}")
    assert gone.status_code == 404 and ids[0] in gone.json()["error"]["message"]
    assert all(httpx.get(f"{flagged.base_url}/v1/responses/{i}").status_code == 200 for i in ids[1:])
    chained = create(flagged, input="again", previous_response_id=ids[0])
    assert chained.status_code == 404 and chained.json()["error"]["param"] == "previous_response_id"


def test_conversations_have_their_own_bound(flagged):
    url = f"{flagged.base_url}/v1/conversations"
    first, second = (httpx.post(url, json={}, timeout=30).json()["id"] for _ in range(2))
    assert httpx.get(f"{url}/{first}").status_code == 404  # a store of one: the newest stays
    assert httpx.get(f"{url}/{second}").status_code == 200
    ids = [create(flagged, input=f"hi {i}").json()["id"] for i in range(2)]  # responses keep two
    assert all(httpx.get(f"{flagged.base_url}/v1/responses/{i}").status_code == 200 for i in ids)


def test_reasoning_items_and_keepalives(flagged):
    body = create(flagged, input="Think about the sea.").json()
    assert [i["type"] for i in body["output"]] == ["reasoning"]  # cut short while thinking: no message
    assert body["output"][0]["content"][0]["text"] and body["output_text"] == ""
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == body["usage"]["output_tokens"]
    lines = []
    with httpx.stream("POST", f"{flagged.base_url}/v1/responses", timeout=60,
                      json={"model": MODEL, "input": "Think about the sea.", "max_output_tokens": 6,
                            "temperature": 0, "stream": True}) as r:  # greedy: no early eos
        lines = list(r.iter_lines())
    assert ": keep-alive" in lines
    response = check_stream(parse_sse(lines))
    kinds = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert response["output"][0]["type"] == "reasoning" and response["status"] == "incomplete"


def test_the_templates_thinking_switch_turns_the_reasoning_parser_off(flagged):
    """Kimi's `thinking: false` (chat_template_kwargs): that request's output is content; without it, reasoning."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Think about the sea."}], "max_tokens": 6,
            "temperature": 0}
    url = f"{flagged.base_url}/v1/chat/completions"
    thinking = httpx.post(url, json=body, timeout=60).json()["choices"][0]["message"]
    off = httpx.post(url, json={**body, "chat_template_kwargs": {"thinking": False}}, timeout=60).json()
    message = off["choices"][0]["message"]
    assert thinking["reasoning_content"] and not thinking["content"]
    assert message["content"] == thinking["reasoning_content"] and not message.get("reasoning_content")


def test_reasoning_effort_is_a_budget_and_the_response_says_it(flagged):
    """With a reasoning parser an effort is a thinking budget and the Response echoes the effort it honoured.
    `none` is a budget of 0: `</think>` first; the text format's grammar holds from there (think, then constrain)."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
              "required": ["city"], "additionalProperties": False}
    none = create(flagged, input="Which city?", reasoning={"effort": "none"}, max_output_tokens=20, temperature=0,
                  text={"format": {"type": "json_schema", "name": "city", "schema": schema}}).json()
    assert none["reasoning"] == {"effort": "none", "summary": None}
    assert [i["type"] for i in none["output"]] == ["message"] and json.loads(none["output_text"])["city"]
    low = create(flagged, input="Hi", reasoning={"effort": "low", "summary": "auto"}, temperature=0).json()
    assert low["reasoning"] == {"effort": "low", "summary": "auto"} and low["output"][0]["type"] == "reasoning"


def test_truncation_auto_drops_the_oldest_items_to_fit(flagged):
    """A conversation longer than the context (1,024 here): with `truncation: "auto"` the oldest items go, a call's
    output with its call, and the newest stay; disabled (the default), a 400 naming `input`. input_tokens counts
    the same truncated prompt."""
    call = [{"type": "function_call", "call_id": "call_old", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_old", "output": "an old answer"}]
    turns = [{"role": "user" if i % 2 == 0 else "assistant",
              "content": f"Turn {i}: " + "the lighthouse keeper logs the ships and the weather " * 6}
             for i in range(40)]
    items = [*call, *turns, {"role": "user", "content": "Now say hi."}]
    too_long = create(flagged, input=items)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "input", too_long.text
    r = create(flagged, input=items, truncation="auto")
    assert r.status_code == 200, r.text
    response = r.json()
    assert response["truncation"] == "auto" and response["status"] in ("completed", "incomplete")
    used = response["usage"]["input_tokens"]
    assert 1024 - 4 - 120 < used <= 1024 - 4  # as many of the newest as fit: fewer than one turn's room is left
    counted = httpx.post(f"{flagged.base_url}/v1/responses/input_tokens",
                         json={"model": MODEL, "input": items, "truncation": "auto", "max_output_tokens": 4},
                         timeout=60).json()["input_tokens"]
    assert counted == used
    assert create(flagged, input=items, truncation="sometimes").json()["error"]["param"] == "truncation"


def test_reasoning_carried_by_the_client_as_codex_carries_it(flagged):
    """Codex CLI and the Agents SDK send `store: false` with `include: ["reasoning.encrypted_content"]` (a 400 here
    before), and send each reasoning item back with its encrypted_content in the next turn's input. The SDK reads the
    items with strict validation; the stream's events are the spec's; the next turn takes the item; a blob of Rill's
    that does not decode is a 400 naming it."""
    import openai

    from rill.asgi.requests.reasoning_blob import unseal
    from tests.helpers.openapi import validate

    sdk = openai.OpenAI(base_url=f"{flagged.base_url}/v1", api_key="x", _strict_response_validation=True)
    ask = dict(model=MODEL, input="Think about the sea.", max_output_tokens=6, temperature=0, store=False,
               include=["reasoning.encrypted_content"])
    first = sdk.responses.create(**ask)
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and unseal(reasoning.encrypted_content, "x") == reasoning.content[0].text
    raw = create(flagged, **{k: v for k, v in ask.items() if k != "model"}).json()
    validate("Response", raw)
    with sdk.responses.create(**ask, stream=True) as stream:
        done = [e.item for e in stream if e.type == "response.output_item.done"]
    assert done[0].encrypted_content == reasoning.encrypted_content  # greedy: the same thinking
    carried = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    turn = [{"role": "user", "content": "Think about the sea."}, carried,
            {"role": "assistant", "content": "The sea is wide."}, {"role": "user", "content": "And the sky?"}]
    again = create(flagged, input=turn, store=False, include=["reasoning.encrypted_content"])
    assert again.status_code == 200, again.text
    broken = create(flagged, input=[*turn[:1], {**carried, "encrypted_content": "rill-reasoning-v1.%%"}, *turn[2:]])
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "input[1].encrypted_content", broken.text
