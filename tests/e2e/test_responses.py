"""The Responses API end to end: the strict OpenAI SDK, the spec's schemas, and the event grammar."""
from __future__ import annotations

import json
import threading

import httpx
import jsonschema
import openai
import pytest

from tests.helpers.openapi import validate
from tests.helpers.responses_events import check_stream, parse_sse

MODEL = "smollm2-135m-instruct"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                               "required": ["city"], "additionalProperties": False}}
COLOR_SCHEMA = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "blue"]}},
                "required": ["color"], "additionalProperties": False}
COLOR_FORMAT = {"format": {"type": "json_schema", "name": "pick", "schema": COLOR_SCHEMA, "strict": True}}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120)


def stream_events(server, body: dict, on_created=None) -> list:
    lines = []
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            lines.append(line)
            if on_created and line.startswith("data: ") and '"response.created"' in line:
                on_created(json.loads(line[6:])["response"]["id"])
    assert "data: [DONE]" not in lines
    return parse_sse(lines)


def test_create_string_input(client, server):
    resp = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=6, temperature=0)
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.status in ("completed", "incomplete")
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    assert resp.output_text == resp.output[0].content[0].text
    assert resp.usage.output_tokens <= 6 and resp.usage.input_tokens > 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.input_tokens_details.cached_tokens >= 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.store is True and resp.truncation == "disabled"
    validate("Response", post(server, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 3}).json())
    # No reasoning parser, and SmolLM2's template reads no effort: the effort changed nothing, and the answer says so.
    asked = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, reasoning={"effort": "high"})
    assert asked.reasoning.effort is None


def test_max_output_tokens_gives_incomplete(client):
    resp = client.responses.create(model=MODEL, input="Write a long story about the sea.", max_output_tokens=3,
                                   temperature=0)
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3
    assert resp.output[0].status == "incomplete"


def test_typed_items_and_instructions(client, server):
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
             {"role": "user", "content": "Thanks. And tomorrow?"}]
    resp = client.responses.create(model=MODEL, input=items, instructions="Answer briefly.", tools=[WEATHER_TOOL],
                                   tool_choice="none", max_output_tokens=4, metadata={"k": "v"}, user="u1")
    assert resp.instructions == "Answer briefly." and resp.metadata == {"k": "v"} and resp.user == "u1"
    assert resp.tools[0].name == "get_weather"
    count = post(server, "/v1/responses/input_tokens", {"model": MODEL, "input": items, "instructions": "Answer briefly.",
                                                          "tools": [WEATHER_TOOL], "tool_choice": "none"}).json()
    assert count == {"object": "response.input_tokens", "input_tokens": resp.usage.input_tokens}
    longer = post(server, "/v1/responses/input_tokens", {"model": MODEL, "input": items, "tool_choice": "none",
                                                           "instructions": "Answer briefly, in one short sentence.",
                                                           "tools": [WEATHER_TOOL]}).json()
    assert longer["input_tokens"] > count["input_tokens"]  # the instructions are in the prompt


def test_json_schema_text_format(client):
    resp = client.responses.create(model=MODEL, input="Pick a color.", max_output_tokens=40, text=COLOR_FORMAT,
                                   temperature=0)
    assert resp.status == "completed"
    jsonschema.validate(json.loads(resp.output_text), COLOR_SCHEMA)
    assert resp.text.format.type == "json_schema"
    obj = client.responses.create(model=MODEL, input="Give a JSON object.", max_output_tokens=30,
                                  text={"format": {"type": "json_object"}})
    if obj.status == "completed":
        assert isinstance(json.loads(obj.output_text), dict)


def test_logprobs_included(client):
    resp = client.responses.create(model=MODEL, input="Hi", max_output_tokens=3, top_logprobs=2, temperature=0,
                                   include=["message.output_text.logprobs"])
    logprobs = resp.output[0].content[0].logprobs
    assert len(logprobs) == 3 and all(len(lp.top_logprobs) == 2 for lp in logprobs)
    # a token's text may be a piece of a UTF-8 character (shown as U+FFFD); its bytes join into the text
    assert bytes(b for lp in logprobs for b in lp.bytes).decode() == resp.output_text


def test_stream_events(server, client):
    response = check_stream(stream_events(server, {"model": MODEL, "input": "Tell me about the moon.",
                                                   "max_output_tokens": 8, "temperature": 0}))
    assert response["status"] == "incomplete" and response["usage"]["output_tokens"] == 8
    # the SDK parses the same stream strictly
    events = list(client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=5, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.output_text == deltas
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == deltas and stored.status == final.status
    # the SDK's stream helper, which waits for response.completed (a grammar makes the output end)
    with client.responses.stream(model=MODEL, input="Pick a color.", max_output_tokens=40, text=COLOR_FORMAT,
                                 temperature=0) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == deltas
    assert json.loads(deltas)["color"] in ("red", "blue")


def test_forced_function_call_streamed_and_not(server, client):
    # Greedy: sampled at temperature 1, the grammar's free whitespace once ran past max_output_tokens.
    body = {"model": MODEL, "input": "Weather in Oslo?", "tools": [WEATHER_TOOL], "max_output_tokens": 30,
            "tool_choice": {"type": "function", "name": "get_weather"}, "temperature": 0}
    response = check_stream(stream_events(server, body))
    calls = [i for i in response["output"] if i["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"])["city"] in ("Paris", "Oslo")
    resp = client.responses.create(**{k: v for k, v in body.items()})
    (call,) = [i for i in resp.output if i.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and json.loads(call.arguments)["city"] in ("Paris", "Oslo")


def test_store_retrieve_chain_input_items_delete(client, server):
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=4)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=4)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    many = client.responses.create(model=MODEL, input=items, max_output_tokens=2)
    page = client.responses.input_items.list(many.id, limit=2, order="asc")
    assert [i.content[0].text for i in page.data] == ["message 0", "message 1"] and page.has_more
    raw = httpx.get(f"{server.base_url}/v1/responses/{many.id}/input_items",
                    params={"limit": 2, "order": "asc", "after": page.data[1].id}).json()
    validate("ResponseItemList", raw)
    assert [i["content"][0]["text"] for i in raw["data"]] == ["message 2", "message 3"]
    assert [i.content[0].text for i in client.responses.input_items.list(many.id).data][0] == "message 4"
    deleted = httpx.delete(f"{server.base_url}/v1/responses/{first.id}").json()
    assert deleted == {"id": first.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError, match=first.id):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    assert info.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model=MODEL, input="x", max_output_tokens=1, store=False)
    assert httpx.get(f"{server.base_url}/responses/{unstored.id}").status_code == 404  # alias without /v1
    assert httpx.get(f"{server.base_url}/v3/responses/{many.id}").status_code == 200


def test_cancel(server, client):
    finished = client.responses.create(model=MODEL, input="x", max_output_tokens=1)
    refused = httpx.post(f"{server.base_url}/v1/responses/{finished.id}/cancel")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "response_id"
    answers, threads = [], []

    def cancel(response_id):
        answers.append(httpx.post(f"{server.base_url}/v1/responses/{response_id}/cancel", timeout=30))

    def start_cancel(response_id):
        threads.append(threading.Thread(target=cancel, args=(response_id,)))
        threads[-1].start()

    events = stream_events(server, {"model": MODEL, "input": "Count to a thousand.", "max_output_tokens": 1500,
                                    "temperature": 0}, on_created=start_cancel)
    for thread in threads:  # the stream can end before the cancel's own answer is read
        thread.join()
    response = check_stream(events)
    assert answers[0].status_code == 200 and answers[0].json()["status"] == "cancelled"
    assert response["status"] == "cancelled" and events[-1][0] == "response.failed"
    assert response["usage"]["output_tokens"] < 1500
    assert client.responses.retrieve(response["id"]).status == "cancelled"


def poll(client, response_id: str, seconds: float = 120):
    import time

    deadline = time.monotonic() + seconds
    while (response := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, response
        time.sleep(0.05)
    return response


def test_background_responses_are_polled_and_cancelled(client):
    """`background: true`: the create answers at once (stored, in progress) and the response runs on; polling GET
    finds it completed with the text the same request gives in the foreground; a cancel ends a running one."""
    body = dict(model=MODEL, input="Name three colors.", max_output_tokens=12, temperature=0)
    plain = client.responses.create(**body)
    started = client.responses.create(**body, background=True)
    assert started.background is True and started.status in ("queued", "in_progress") and started.output == []
    done = poll(client, started.id)
    assert (done.status, done.output_text, done.usage.output_tokens) == \
        (plain.status, plain.output_text, plain.usage.output_tokens)
    assert done.background is True
    long = client.responses.create(model=MODEL, input="Count to a thousand.", max_output_tokens=1500, temperature=0,
                                   background=True)
    assert client.responses.cancel(long.id).status == "cancelled"
    cancelled = poll(client, long.id)
    assert cancelled.status == "cancelled" and cancelled.usage.output_tokens < 1500


def raw_events(server, path: str) -> list:
    with httpx.stream("GET", f"{server.base_url}{path}", timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return parse_sse(r.iter_lines())


def test_a_background_stream_goes_on_without_its_client_and_resumes(client, server):
    """`background` with `stream`: the create streams the events; a client that leaves loses nothing, the response
    runs on and GET ?stream=true&starting_after=N sends the rest, numbered on, to the terminal event; the text is the
    foreground's. Once it has ended the whole stream reads again from the store, event for event."""
    body = dict(model=MODEL, input="Name three colors.", max_output_tokens=24, temperature=0)
    plain = client.responses.create(**body)
    first = []
    with client.responses.create(**body, background=True, stream=True) as stream:
        for event in stream:
            first.append(event)
            if event.type == "response.output_text.delta":
                break  # the client leaves
    response_id = first[0].response.id
    assert first[0].response.background is True
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number))
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == f"response.{plain.status}"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text == events[-1].response.output_text
    again = raw_events(server, f"/v1/responses/{response_id}?stream=true")
    assert check_stream(again)["output_text"] == text  # the event grammar and OpenAI's spec, event by event
    assert [e for _, e in again] == [e.model_dump(mode="json", exclude_unset=True) for e in events]
    assert raw_events(server, f"/v1/responses/{response_id}?stream=true&starting_after={len(events) - 1}") == []
    assert client.responses.retrieve(response_id).status == plain.status  # without stream: the Response
    whole = list(client.responses.create(**body, background=True, stream=True))  # read to its end
    assert whole[-1].response.output_text == text and whole[-1].sequence_number == len(whole) - 1


@pytest.mark.parametrize("query, param", [("stream=true", "stream"), ("stream=maybe", "stream"),
                                          ("stream=true&starting_after=-1", "starting_after"),
                                          ("stream=true&starting_after=x", "starting_after"),
                                          ("stream=true&starting_after=1234567890123", "starting_after")])
def test_a_stream_is_kept_only_for_background_streams(client, server, query, param):
    """GET ?stream=true of a response made without `background` and `stream` (none of its events were kept)."""
    made = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    r = httpx.get(f"{server.base_url}/v1/responses/{made.id}?{query}", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [WEATHER_TOOL, {"type": "file_search"}]}, "tools[1].type"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"background": True, "store": False}, "background"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
    ({"conversation": 5}, "conversation"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function"}, "tools": [WEATHER_TOOL]}, "tool_choice.name"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": "yes"}}}, "text.format.strict"),
    ({"text": {"format": {"type": "json_schema", "name": 5, "schema": {}}}}, "text.format.name"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": [{"type": "reasoning", "summary": ["x"]}, {"role": "user", "content": "hi"}]}, "input[0].summary[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
    ({"input": []}, "input"),
])
def test_bad_requests_name_param(server, extra, param):
    r = post(server, "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert "response_format" not in error["message"]  # chat's name never leaks into the Responses API


def test_unknown_ids_404(server):
    r = httpx.get(f"{server.base_url}/v1/responses/resp_nope")
    assert r.status_code == 404 and "resp_nope" in r.json()["error"]["message"]
    assert httpx.delete(f"{server.base_url}/v1/responses/resp_nope").status_code == 404
    assert httpx.get(f"{server.base_url}/v1/responses/resp_nope/input_items").status_code == 404
    assert post(server, "/v1/responses", {"model": "other", "input": "hi"}).status_code == 404


def test_conversations(client, server):
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "My name is Ada."}],
                                       metadata={"topic": "names"})
    validate("ConversationResource", httpx.get(f"{server.base_url}/v1/conversations/{conv.id}").json())
    assert conv.metadata == {"topic": "names"}
    resp = client.responses.create(model=MODEL, input="What is my name?", conversation=conv.id, max_output_tokens=3)
    assert resp.conversation.id == conv.id
    alone = post(server, "/v1/responses/input_tokens", {"model": MODEL, "input": "What is my name?"}).json()
    assert resp.usage.input_tokens > alone["input_tokens"]
    items = client.conversations.items.list(conv.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "message"]
    assert [i.role for i in items.data] == ["user", "user", "assistant"]
    raw = httpx.get(f"{server.base_url}/v1/conversations/{conv.id}/items").json()
    validate("ConversationItemList", raw)
    assert raw["data"][0]["id"] == resp.output[0].id  # newest first
    again = client.responses.create(model=MODEL, input="And again?", conversation={"id": conv.id}, max_output_tokens=2)
    assert again.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens
    added = client.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "Hi"}])
    assert client.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id).id == added.data[0].id
    client.conversations.items.delete(added.data[0].id, conversation_id=conv.id)
    assert len(client.conversations.items.list(conv.id, limit=100).data) == 5
    assert client.conversations.update(conv.id, metadata={"topic": "x"}).metadata == {"topic": "x"}
    assert client.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError, match=conv.id):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="x", conversation=conv.id)
    assert info.value.body["param"] == "conversation"
