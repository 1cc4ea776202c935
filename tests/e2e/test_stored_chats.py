"""Stored Chat Completions through the OpenAI SDK (strict) on the shared server: `store: true` keeps a completion
(a stream's put together), and the list, retrieve, update, delete and messages routes read it, as OpenAI's spec."""
from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"
GREEDY = {"model": MODEL, "max_tokens": 6, "temperature": 0}


def test_stored_completions_are_listed_read_updated_and_deleted(client, server):
    tag = uuid.uuid4().hex  # this test's own, among whatever else the shared server keeps
    plain = client.chat.completions.create(messages=[{"role": "user", "content": "Name a colour."}], store=True,
                                           metadata={"tag": tag, "kind": "plain"}, n=2, **GREEDY)
    chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": "Name a fruit."}], store=True,
                                                  metadata={"tag": tag, "kind": "stream"}, stream=True,
                                                  stream_options={"include_usage": True}, **GREEDY))
    unstored = client.chat.completions.create(messages=[{"role": "user", "content": "Name a tree."}],
                                              metadata={"tag": tag}, **GREEDY)
    streamed_id = chunks[0].id

    got = client.chat.completions.retrieve(plain.id)
    assert got.model_dump(exclude={"metadata"}) == plain.model_dump(exclude={"metadata"})  # the answer, as sent
    assert got.metadata == {"tag": tag, "kind": "plain"} and len(got.choices) == 2
    raw = httpx.get(f"{server.base_url}/v1/chat/completions/{streamed_id}").json()
    validate("CreateChatCompletionResponse", raw)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert raw["choices"][0]["message"]["content"] == text and text
    assert raw["choices"][0]["finish_reason"] == next(c.choices[0].finish_reason for c in chunks
                                                     if c.choices and c.choices[0].finish_reason)
    usage = chunks[-1].usage
    assert (raw["usage"]["prompt_tokens"], raw["usage"]["completion_tokens"]) == (usage.prompt_tokens,
                                                                                 usage.completion_tokens)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(unstored.id)  # store left out: kept nowhere

    def listed(**kw) -> list[str]:
        return [c.id for c in client.chat.completions.list(metadata={"tag": tag}, **kw)]
    assert listed() == [plain.id, streamed_id]  # oldest first, as OpenAI's default
    assert listed(order="desc") == [streamed_id, plain.id]
    page = client.chat.completions.list(metadata={"tag": tag}, limit=1)
    assert [c.id for c in page.data] == [plain.id] and page.has_more
    assert [c.id for c in page.get_next_page().data] == [streamed_id]  # the SDK pages with `after`
    assert listed(model=MODEL) == [plain.id, streamed_id] and listed(model="another") == []
    assert [c.id for c in client.chat.completions.list(metadata={"tag": tag, "kind": "stream"})] == [streamed_id]
    body = httpx.get(f"{server.base_url}/v1/chat/completions", params={"metadata[tag]": tag}).json()
    validate("ChatCompletionList", body)
    assert (body["first_id"], body["last_id"], body["has_more"]) == (plain.id, streamed_id, False)

    updated = client.chat.completions.update(streamed_id, metadata={"tag": tag, "kind": "renamed"})
    assert updated.metadata == {"tag": tag, "kind": "renamed"} and updated.choices[0].message.content == text
    assert [c.id for c in client.chat.completions.list(metadata={"kind": "renamed", "tag": tag})] == [streamed_id]

    deleted = client.chat.completions.delete(plain.id)
    assert deleted.deleted and deleted.id == plain.id
    validate("ChatCompletionDeleted", deleted.model_dump())
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(plain.id)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.delete(plain.id)
    assert listed() == [streamed_id]


def test_messages_are_the_requests_own_a_page_at_a_time(client, server):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi."}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
                {"role": "user", "content": "Go on.", "name": "ada"}]
    done = client.chat.completions.create(messages=messages, store=True, **GREEDY)
    url = f"{server.base_url}/v1/chat/completions/{done.id}/messages"
    body = httpx.get(url).json()
    # The spec's schema gives these the answer's role only (its own example lists a user's): the rest holds to it.
    for message in body["data"]:
        validate("ChatCompletionMessageList", {**body, "data": [{**message, "role": "assistant", "refusal": None}]})
    data = body["data"]
    assert [m["id"] for m in data] == [f"{done.id}-{i}" for i in range(5)] and not body["has_more"]
    assert [m["role"] for m in data] == ["system", "user", "assistant", "tool", "user"]
    assert data[0]["content"] == "Be brief." and data[0]["content_parts"] is None
    assert data[1]["content"] == "Say hi." and data[1]["content_parts"] == messages[1]["content"]
    assert data[2]["tool_calls"] == messages[2]["tool_calls"] and data[3]["tool_call_id"] == "call_1"
    assert data[4]["name"] == "ada"
    page = httpx.get(url, params={"limit": 2, "after": data[1]["id"]}).json()
    assert [m["id"] for m in page["data"]] == [data[2]["id"], data[3]["id"]] and page["has_more"]
    page = httpx.get(url, params={"limit": 2, "order": "desc"}).json()
    assert [m["id"] for m in page["data"]] == [data[4]["id"], data[3]["id"]] and page["has_more"]
    lenient = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    assert [m.content for m in lenient.chat.completions.messages.list(done.id, limit=3).data] == [
        "Be brief.", "Say hi.", None]


@pytest.mark.parametrize(("method", "path", "body", "status", "param"), [
    ("GET", "/v1/chat/completions?limit=0", None, 400, "limit"),
    ("GET", "/v1/chat/completions?order=up", None, 400, "order"),
    ("GET", "/v1/chat/completions?after=chatcmpl-nothere", None, 400, "after"),
    ("GET", "/v1/chat/completions/chatcmpl-nothere", None, 404, "completion_id"),
    ("GET", "/v1/chat/completions/resp_1", None, 404, None),  # not a completion's id: no route
    ("DELETE", "/v1/chat/completions/chatcmpl-nothere", None, 404, "completion_id"),
    ("POST", "/v1/chat/completions/chatcmpl-nothere", {"metadata": {}}, 404, "completion_id"),
    ("GET", "/v1/chat/completions/chatcmpl-nothere/messages", None, 404, "completion_id"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "store": True,
                                      "metadata": {str(i): "v" for i in range(17)}}, 400, "metadata"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "store": True,
                                      "metadata": {"k": "v" * 513}}, 400, "metadata"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "store": "yes"}, 400, "store"),
])
def test_bad_requests_name_their_field(server, method, path, body, status, param):
    resp = httpx.request(method, f"{server.base_url}{path}", json=body)
    assert resp.status_code == status, resp.text
    if param:
        assert resp.json()["error"]["param"] == param, resp.text


def test_an_update_needs_metadata_and_a_kept_completions_messages_need_a_known_after(client, server):
    done = client.chat.completions.create(messages=[{"role": "user", "content": "Hi."}], store=True, **GREEDY)
    base = f"{server.base_url}/v1/chat/completions/{done.id}"
    resp = httpx.post(base, json={})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "metadata"
    resp = httpx.get(f"{base}/messages", params={"after": f"{done.id}-9"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "after"
    assert httpx.post(base, json={"metadata": None}).json()["metadata"] == {}
    client.chat.completions.delete(done.id)
