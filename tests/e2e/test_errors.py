"""Bad input gets an OpenAI error body with the right status and param; the server stays up."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.helpers.http_calls import check_error

MODEL = "smollm2-135m-instruct"
MSGS = [{"role": "user", "content": "hi"}]


def chat(server, body=None, **kw):
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60, **kw)


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "messages": MSGS, "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": MSGS, "max_tokens": "ten"}, "max_tokens"),
    ({"model": MODEL, "messages": MSGS, "temperature": 3}, "temperature"),
    ({"model": MODEL, "messages": MSGS, "top_p": 0}, "top_p"),
    ({"model": MODEL, "messages": "hi"}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role"),
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": MSGS, "stream": "yes"}, "stream"),
    ({"model": MODEL, "messages": MSGS, "stop": [""]}, "stop"),
    ({"model": MODEL, "messages": MSGS, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": MODEL, "messages": MSGS, "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type"),
])
def test_bad_parameters_name_the_param(server, body, param):
    check_error(chat(server, body), 400, param)


@pytest.mark.parametrize("field,value,param", [
    ("seed", 2**64, "seed"), ("seed", -(2**63) - 1, "seed"), ("seed", 10**400, "seed"),
    ("top_k", 2**63, "top_k"), ("top_k", 2**64 - 1, "top_k"), ("min_tokens", 10**20, "min_tokens"),
    ("stop_token_ids", [2**64], "stop_token_ids[0]"),
], ids=["seed-2**64", "seed-below-int64", "seed-10**400", "top_k-2**63", "top_k-2**64-1", "min_tokens-10**20",
        "stop_token_ids-2**64"])
def test_integers_past_int64_are_400(server, field, value, param):
    """Past int64 a value cannot reach the engine (msgpack, int64 tensors): a 400, not a 500."""
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 2, field: value}
    check_error(chat(server, content=json.dumps(body), headers={"content-type": "application/json"}), 400, param)


@pytest.mark.parametrize("extra,param", [
    ({"audio": {"voice": "alloy"}}, "audio"), ({"web_search_options": {}}, "web_search_options"),
    ({"logits_processors": ["my.Processor"]}, "logits_processors"),
])
def test_later_parameters_are_refused_not_ignored(server, extra, param):
    check_error(chat(server, {"model": MODEL, "messages": MSGS, **extra}), 400, param, "unsupported_parameter")


def test_completions_bad_prompts(server):
    url = f"{server.base_url}/v1/completions"
    for prompt in ([], [1, "a"], [[1], []], [10**9], ""):
        param = "prompt[0]" if prompt == [10**9] else "prompt"
        check_error(httpx.post(url, json={"model": MODEL, "prompt": prompt}), 400, param)
    for extra, param in (({"max_tokens": 0}, "max_tokens"), ({"best_of": 3, "n": 4}, "best_of"), ({"suffix": "x"}, "suffix")):
        check_error(httpx.post(url, json={"model": MODEL, "prompt": "a", **extra}), 400, param)


def test_malformed_json(server):
    err = check_error(chat(server, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"}), 400)
    assert "JSON" in err["message"]
    check_error(chat(server, content=b"\xff\xfe not json", headers={"content-type": "application/json"}), 400)
    # msgspec raises UnicodeDecodeError and RecursionError for these, outside its DecodeError,
    # and skips a key with bad UTF-8 as an unknown field (the request was served without it)
    for raw in (b'{"model": "x", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
                b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_t\xffokens": 4}'
                % MODEL.encode(),
                b'{"model": "x", "user": "\xc3"}',
                b'{"a": ' * 10_000 + b"1" + b"}" * 10_000,
                b'{"model": "x", "functions": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"):
        check_error(chat(server, content=raw, headers={"content-type": "application/json"}), 400, code="invalid_json")


def test_unknown_model_is_404(server, client):
    check_error(chat(server, {"model": "gpt-17", "messages": MSGS}), 404, "model", "model_not_found")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=MSGS)


def test_context_length_exceeded(server, client):
    long_prompt = "hello " * 3000  # over the fixture's --max-model-len 2048
    err = check_error(chat(server, {"model": MODEL, "messages": [{"role": "user", "content": long_prompt}]}),
                      400, "messages", "context_length_exceeded")
    assert "2048" in err["message"]
    check_error(chat(server, {"model": MODEL, "messages": MSGS, "max_tokens": 5000}), 400, "max_tokens",
                "context_length_exceeded")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=5)


def test_body_over_limit_is_413(server):
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (33 << 20) + b'"}]}'
    check_error(chat(server, content=big, headers={"content-type": "application/json"}), 413)


def test_wrong_method_and_unknown_path(server):
    check_error(httpx.put(f"{server.base_url}/v1/chat/completions"), 405)  # GET lists the stored ones
    check_error(httpx.delete(f"{server.base_url}/v1/models"), 405)
    check_error(httpx.get(f"{server.base_url}/v1/nothing-here"), 404)


def test_body_declared_as_something_else_than_json_is_415(server):
    body = json.dumps({"model": MODEL, "messages": MSGS, "max_tokens": 1})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        check_error(chat(server, content=body, headers={"content-type": content_type}), 415,
                    code="unsupported_media_type")
    # No Content-Type at all is refused too: a web page can send that cross-origin without a preflight.
    check_error(chat(server, content=body), 415, code="unsupported_media_type")
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert chat(server, content=body, headers={"content-type": content_type}).status_code == 200, content_type


def test_nulls_the_spec_allows_are_not_errors(server):
    """OpenAI's spec makes stream and echo nullable (the SDK sends `stream=None` as null)."""
    ok = chat(server, {"model": MODEL, "messages": MSGS, "max_tokens": 2, "stream": None})
    assert ok.status_code == 200 and ok.json()["object"] == "chat.completion"
    ok = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                    json={"model": MODEL, "prompt": "a", "max_tokens": 2, "stream": None, "echo": None})
    assert ok.status_code == 200 and ok.json()["object"] == "text_completion"


def test_server_still_serves_after_bad_input(client):
    resp = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=3)
    assert resp.choices[0].message.content is not None


def test_every_json_route_refuses_bad_utf8_and_deep_nesting_alike(server, client):
    """One decoder serves every JSON body: what chat refuses, the other routes refuse the same way."""
    conv = client.conversations.create(items=[])
    routes = ["/v1/completions", "/v1/responses", "/tokenize", "/detokenize", "/v1/conversations",
              f"/v1/conversations/{conv.id}", f"/v1/conversations/{conv.id}/items"]
    bodies = (b'{"model": "%s", "metad\xffata": {}}' % MODEL.encode(), b'{"a": ' * 10_000 + b"1" + b"}" * 10_000)
    for route in routes:
        for raw in bodies:
            resp = httpx.post(server.base_url + route, content=raw, headers={"content-type": "application/json"},
                              timeout=30)
            assert resp.status_code == 400, (route, raw[:40], resp.text)
            check_error(resp, 400, code="invalid_json")
