"""SGLang's native POST /generate on the shared server: greedy, the same text as /v1/completions on the same prompt
(each prompt opened by a nonce and the OpenAI request salted, so that neither reads the other's cached blocks),
SGLang's cumulative stream, a batch, token-id prompts, a JSON schema, and the 400s naming SGLang's fields."""
from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.helpers.http_calls import MODEL

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


def post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/generate", json=body, timeout=120)


def prompt() -> str:
    return f"Note {uuid.uuid4().hex}. The three largest cities of France are"


def reference(client, text: str):
    return client.completions.create(model=MODEL, prompt=text, max_tokens=10, temperature=0,
                                     extra_body={"ignore_eos": True, "cache_salt": uuid.uuid4().hex})


def test_a_greedy_generate_is_the_completions_text(server, client):
    text = prompt()
    answer = post(server, {"text": text, "sampling_params": GREEDY}).json()
    plain = reference(client, text)
    assert answer["text"] == plain.choices[0].text and len(answer["output_ids"]) == 10
    meta = answer["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 10} and meta["completion_tokens"] == 10
    assert meta["prompt_tokens"] == plain.usage.prompt_tokens and meta["id"].startswith("sgl-")


def test_the_stream_is_cumulative_and_ends_with_done(server, client, tokenizer):
    text = prompt()
    with httpx.stream("POST", f"{server.base_url}/generate", json={"text": text, "sampling_params": GREEDY,
                                                                   "stream": True}, timeout=120) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # each event holds the text so far
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
    last = events[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "length" and last["meta_info"]["completion_tokens"] == 10
    assert last["text"] == reference(client, text).choices[0].text == tokenizer.decode(last["output_ids"])


def test_a_batch_and_token_id_prompts(server, tokenizer):
    texts = [prompt(), prompt()]
    batch = post(server, {"text": texts, "sampling_params": {**GREEDY, "max_new_tokens": 4}}).json()
    assert [a["index"] for a in batch] == [0, 1] and all(len(a["output_ids"]) == 4 for a in batch)
    assert batch[0]["meta_info"]["id"] != batch[1]["meta_info"]["id"]
    ids = [tokenizer.encode(t).ids for t in texts]
    by_ids = post(server, {"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 4}}).json()
    assert [a["meta_info"]["prompt_tokens"] for a in by_ids] == [len(i) for i in ids]
    one = post(server, {"input_ids": ids[0], "sampling_params": {**GREEDY, "max_new_tokens": 4}}).json()
    assert isinstance(one, dict) and one["meta_info"]["prompt_tokens"] == len(ids[0])


def test_a_json_schema_is_followed(server):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    answer = post(server, {"text": "Name a city as JSON: ", "sampling_params": {
        "json_schema": json.dumps(schema), "temperature": 0.8, "seed": 3, "max_new_tokens": 40}}).json()
    assert set(json.loads(answer["text"])) == {"city"} and answer["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("body,param", [
    ({"text": "Hi", "return_logprob": True}, "return_logprob"),
    ({"text": "Hi", "input_ids": [1, 2]}, "text"),
    ({}, "text"),
    ({"text": ["a", "b"], "stream": True}, "stream"),
    ({"input_ids": [[1], "x"]}, "input_ids"),
    ({"input_ids": [10**9]}, "input_ids[0]"),
    ({"text": "Hi", "sampling_params": {"max_new_tokens": 10**9}}, "sampling_params.max_new_tokens"),
    ({"text": "Hi", "sampling_params": {"json_schema": "{not json"}}, "sampling_params.json_schema"),
    ({"text": "Hi", "sampling_params": {"temperature": 5}}, "sampling_params.temperature"),
    ({"text": "Hi", "model": "no-such-model"}, "model"),
])
def test_bad_generate_requests_name_the_field(server, body, param):
    r = post(server, body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.text
