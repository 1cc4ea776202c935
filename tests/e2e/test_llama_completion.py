"""llama.cpp's native POST /completion on the shared server: greedy, the same text as /v1/completions on the same
prompt; streamed in llama.cpp's events; token ids in `tokens`; a JSON schema and a GBNF grammar obeyed; the 400s."""
from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.helpers.server import sdk_client

MODEL = "smollm2-135m-instruct"
PROMPT = "The three largest cities of France are"


def salt() -> str:
    """A namespace of its own in the prefix cache: a greedy text never depends on another request's blocks."""
    return uuid.uuid4().hex


def post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/completion", json=body, timeout=120)


def test_a_greedy_completion_is_the_openai_routes_text_in_llama_cpps_shape(server):
    plain = sdk_client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                                  extra_body={"ignore_eos": True, "cache_salt": salt()})
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "ignore_eos": True, "cache_salt": salt(),
            "cache_prompt": True, "id_slot": -1, "samplers": ["top_k"]}  # fields this server does not read: ignored
    r = post(server, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["content"] == plain.choices[0].text and answer["stop"] is True
    assert answer["tokens_predicted"] == 12 and answer["tokens_evaluated"] == plain.usage.prompt_tokens
    assert answer["stop_type"] == "limit" and answer["timings"]["predicted_n"] == 12 and "tokens" not in answer
    with httpx.stream("POST", f"{server.base_url}/completion", json={**body, "stream": True, "cache_salt": salt()},
                      timeout=120) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines]
    assert "".join(e["content"] for e in events) == answer["content"]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1]["tokens_predicted"] == 12 and "[DONE]" not in lines[-1]


def test_return_tokens_and_a_prompt_of_token_ids(server, tokenizer):
    ids = tokenizer.encode(PROMPT).ids
    body = {"prompt": ids, "n_predict": 8, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    answer = post(server, {**body, "cache_salt": salt()}).json()
    assert answer["tokens_evaluated"] == len(ids) and len(answer["tokens"]) == 8
    assert tokenizer.decode(answer["tokens"]) == answer["content"]
    with httpx.stream("POST", f"{server.base_url}/completion", json={**body, "stream": True, "cache_salt": salt()},
                      timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert [t for e in events[:-1] for t in e["tokens"]] == answer["tokens"] and events[-1]["tokens"] == []


def test_n_probs_gives_each_tokens_logprob_and_the_top_n(server):
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "ignore_eos": True, "n_probs": 3, "return_tokens": True}
    answer = post(server, {**body, "cache_salt": salt()}).json()
    probs = answer["completion_probabilities"]
    assert [p["id"] for p in probs] == answer["tokens"] and "".join(p["token"] for p in probs) == answer["content"]
    for p in probs:
        top = p["top_logprobs"]
        assert len(top) == 3 and top[0]["id"] == p["id"] and top[0]["logprob"] == pytest.approx(p["logprob"])  # greedy
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True) and top[0]["logprob"] < 0
        assert bytes(p["bytes"]).decode() == p["token"]
    with httpx.stream("POST", f"{server.base_url}/completion", json={**body, "stream": True, "cache_salt": salt()},
                      timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    streamed = [p for e in events[:-1] for p in e["completion_probabilities"]]
    assert [p["id"] for p in streamed] == answer["tokens"]
    assert [p["logprob"] for p in streamed] == pytest.approx([p["logprob"] for p in probs], abs=1e-3)


def test_a_json_schema_and_a_grammar_are_obeyed(server):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    answer = post(server, {"prompt": "Name a city as JSON: ", "n_predict": 40, "json_schema": schema,
                           "temperature": 0.8, "seed": 3}).json()
    assert set(json.loads(answer["content"])) == {"city"} and answer["stop_type"] == "eos"
    for seed in (1, 2, 3):
        answer = post(server, {"prompt": "Is Paris in France? Answer: ", "n_predict": 8, "temperature": 1.0,
                               "seed": seed, "grammar": 'root ::= "yes" | "no" | "maybe"'}).json()
        assert answer["content"] in ("yes", "no", "maybe"), answer


@pytest.mark.parametrize("body,param", [
    ({"prompt": "Hi", "n_probs": 21}, "n_probs"),
    ({"prompt": "Hi", "n_probs": 2, "post_sampling_probs": True}, "post_sampling_probs"),
    ({"prompt": "Hi", "n_predict": -2}, "n_predict"),
    ({"prompt": "Hi", "n_predict": 10**9}, "n_predict"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10**9]}, "prompt[0]"),
    ({"prompt": ["a", "b"]}, "prompt[0]"),  # one prompt a request
    ({"prompt": "Hi", "json_schema": {"type": "no-such-type"}}, "json_schema"),
    ({"prompt": "Hi", "grammar": "root ::= ("}, "grammar"),
    ({"prompt": "Hi", "temperature": -1}, "temperature"),
    ({"n_predict": 2}, "prompt"),
])
def test_bad_completion_requests_are_400s_naming_the_field(server, body, param):
    r = post(server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "guided" not in error["message"], error


def test_props_and_apply_template(server, client, tokenizer):
    """llama.cpp's /props (what clients read the context size and template from) and /apply-template (the
    template's text): the prompt text chat completions would tokenize."""
    props = httpx.get(f"{server.base_url}/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 2048 and props["total_slots"] >= 1
    assert "<|im_start|>" in props["chat_template"] and props["modalities"] == {"vision": False, "audio": False}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    text = httpx.post(f"{server.base_url}/apply-template", json={"messages": messages}, timeout=30).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n")
    usage = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1).usage
    assert len(tokenizer.encode(text, add_special_tokens=False).ids) == usage.prompt_tokens
    bad = httpx.post(f"{server.base_url}/apply-template", json={"messages": []}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_the_completions_alias_and_embedding(server):
    """llama-server's other name for /completion, and its native /embedding: each input's pooled vector (as
    /v1/embeddings gives it) in llama.cpp's `[{"index", "embedding": [vector]}]`; /v1/embeddings' 400s."""
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "cache_salt": salt()}
    assert httpx.post(f"{server.base_url}/completions", json=body, timeout=120).json()["content"] == \
        post(server, {**body, "cache_salt": salt()}).json()["content"]
    texts = ["Paris is large.", "Rome is old."]
    r = httpx.post(f"{server.base_url}/embedding", json={"content": texts}, timeout=120)
    assert r.status_code == 200, r.text
    expected = sdk_client(server).embeddings.create(model=MODEL, input=texts, encoding_format="float").data
    assert [item["index"] for item in r.json()] == [0, 1]
    for item, want in zip(r.json(), expected):
        [vector] = item["embedding"]
        assert vector == pytest.approx(want.embedding, abs=1e-5)
    one = httpx.post(f"{server.base_url}/embedding", json={"content": texts[0]}, timeout=120).json()
    assert one[0]["embedding"][0] == pytest.approx(expected[0].embedding, abs=1e-5)
    for bad in ({"content": ""}, {}, {"content": "x", "model": "nope"}):
        assert httpx.post(f"{server.base_url}/embedding", json=bad, timeout=60).status_code in (400, 404)
