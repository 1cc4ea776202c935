"""Hardening: every request body is bounded, and client JSON nested deep is a 400 naming the field, never
a 500 (issue 30). Against the session's tiny server, with raw HTTP."""
from __future__ import annotations

import httpx
import pytest

from tests.helpers.bad_bodies import problem
from tests.helpers.server import TINY_MAX_LOGPROBS, TINY_MODEL

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]


def nested_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_schema(levels: int) -> dict:
    """An object schema whose one property is an object schema, `levels` deep (two JSON levels each)."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def post(server, path: str, body: dict, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=timeout)


def assert_400(resp: httpx.Response, param: str) -> None:
    assert (why := problem(resp, 400)) is None, why
    assert resp.json()["error"]["param"] == param, resp.text[:300]


def assert_anthropic_400(resp: httpx.Response) -> None:
    """The Messages API's errors have Anthropic's shape, which names no parameter."""
    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "invalid_request_error", resp.text[:300]


def assert_still_serves(server) -> None:
    resp = post(server, CHAT, {"model": TINY_MODEL, "messages": HI, "max_tokens": 2})
    assert resp.status_code == 200, resp.text


ASSISTANT_CALL = {"role": "assistant", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": nested_list(1000)}}]}


@pytest.mark.parametrize("param, fields", [
    ("guided_json", {"guided_json": nested_list(1000)}),
    ("response_format.json_schema.schema",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": nested_list(1000)}}}),
    ("structured_outputs.json", {"structured_outputs": {"json": nested_list(1000)}}),
    # Decoded fine by msgspec, then walked by the template, json and the grammar compiler.
    ("guided_json", {"guided_json": nested_schema(100)}),
    ("tools[0].function.parameters", {"tools": [{"type": "function", "function": {
        "name": "f", "strict": True, "parameters": nested_schema(100)}}]}),
    ("messages[1].tool_calls[0].function.arguments",
     {"messages": [*HI, ASSISTANT_CALL, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}),
])
def test_client_json_nested_too_deep_is_a_400_naming_the_field(tiny_server, param, fields):
    body = {"model": TINY_MODEL, "messages": HI, "max_tokens": 2, **fields}
    assert_400(post(tiny_server, CHAT, body), param)


@pytest.mark.parametrize("key", ["--5", "1" * 5000])
def test_logit_bias_keys_that_are_not_token_ids_are_400s(tiny_server, key):
    body = {"model": TINY_MODEL, "messages": HI, "max_tokens": 2, "logit_bias": {key: 1}}
    assert_400(post(tiny_server, CHAT, body), "logit_bias")


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("path, param, bound, fields", [
    (CHAT, "messages", 4096, {"messages": HI * 4097}),
    (CHAT, "stop", 16, {"stop": ["x"] * 17}),
    (CHAT, "stop_token_ids", 64, {"stop_token_ids": [1] * 65}),
    (CHAT, "logit_bias", 1024, {"logit_bias": {str(i): 1 for i in range(1025)}}),
    (CHAT, "tools", 128, {"tools": [TOOL] * 129}),
    (CHAT, "messages[0].name", 256, {"messages": [{"role": "user", "content": "Hi", "name": "n" * 257}]}),
    ("/v1/completions", "prompt", 2048, {"prompt": ["x"] * 2049}),
    ("/v1/responses", "input", 4096, {"input": HI * 4097}),
    ("/v1/messages", "messages", 4096, {"messages": HI * 4097, "max_tokens": 2}),
    ("/tokenize", "messages", 4096, {"messages": HI * 4097}),
    ("/detokenize", "tokens", 256, {"tokens": [1] * 257}),  # past the tiny server's context of 256
])
def test_fields_past_their_bound_are_400s_naming_them(tiny_server, path, param, bound, fields):
    resp = post(tiny_server, path, {"model": TINY_MODEL, "messages": HI, "max_tokens": 2, **fields})
    if path == "/v1/messages":
        assert_anthropic_400(resp)
    else:
        assert_400(resp, param)
    assert str(bound) in resp.json()["error"]["message"], resp.text[:300]  # not another 400 (the context's)


def test_prompt_list_times_n_is_capped_before_any_work(tiny_server):
    """2,048 prompts x n 128 would be 262,144 choices built on one worker's loop: refused at once."""
    body = {"model": TINY_MODEL, "prompt": ["a"] * 2048, "n": 128, "max_tokens": 1}
    assert_400(post(tiny_server, "/v1/completions", body, timeout=20), "n")
    assert_still_serves(tiny_server)


def test_an_unknown_models_name_is_echoed_only_in_part(tiny_server):
    resp = post(tiny_server, CHAT, {"model": "m" * 100_000, "messages": HI, "max_tokens": 2})
    assert resp.status_code == 404 and len(resp.content) < 1000, resp.text[:300]


@pytest.mark.parametrize("path, param, body", [
    (CHAT, "top_logprobs", {"logprobs": True, "top_logprobs": TINY_MAX_LOGPROBS + 1}),
    (CHAT, "prompt_logprobs", {"prompt_logprobs": TINY_MAX_LOGPROBS + 1}),
    ("/v1/completions", "logprobs", {"prompt": "Hi", "logprobs": TINY_MAX_LOGPROBS + 1}),
    ("/v1/responses", "top_logprobs", {"input": "Hi", "top_logprobs": TINY_MAX_LOGPROBS + 1,
                                       "include": ["message.output_text.logprobs"]}),
    ("/completion", "n_probs", {"prompt": "Hi", "n_probs": TINY_MAX_LOGPROBS + 1}),
    (CHAT, "top_logprobs", {"logprobs": True, "top_logprobs": 1 << 21}),  # past what a body may spell at all
])
def test_top_logprobs_past_the_servers_max_logprobs_are_400s(tiny_server, path, param, body):
    resp = post(tiny_server, path, {"model": TINY_MODEL, "messages": HI, "max_tokens": 2, **body})
    assert_400(resp, param)
    if body.get(param, body.get("top_logprobs")) == TINY_MAX_LOGPROBS + 1:
        assert f"at most {TINY_MAX_LOGPROBS} (--max-logprobs)" in resp.json()["error"]["message"], resp.text[:300]


def test_the_servers_max_logprobs_are_served(tiny_server):
    """--max-logprobs 40 (the default is 20, vLLM's): a chat token's top_logprobs and a completion token's
    logprobs as many as that, prompt logprobs too."""
    chat = post(tiny_server, CHAT, {"model": TINY_MODEL, "messages": HI, "max_tokens": 2, "logprobs": True,
                                    "top_logprobs": TINY_MAX_LOGPROBS, "prompt_logprobs": TINY_MAX_LOGPROBS})
    assert chat.status_code == 200, chat.text[:300]
    tokens = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(tokens) == 2 and all(len(t["top_logprobs"]) == TINY_MAX_LOGPROBS for t in tokens)
    assert all(len(p) >= TINY_MAX_LOGPROBS for p in chat.json()["prompt_logprobs"][1:])
    done = post(tiny_server, "/v1/completions", {"model": TINY_MODEL, "prompt": "Hi", "max_tokens": 2,
                                                 "logprobs": TINY_MAX_LOGPROBS})
    assert done.status_code == 200, done.text[:300]
    counts = [len(top) for top in done.json()["choices"][0]["logprobs"]["top_logprobs"]]
    assert len(counts) == 2 and all(TINY_MAX_LOGPROBS <= n <= TINY_MAX_LOGPROBS + 1 for n in counts)  # and the chosen
