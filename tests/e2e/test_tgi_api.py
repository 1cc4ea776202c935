"""Text Generation Inference's native API on the shared server, through huggingface_hub's InferenceClient (its
text_generation posts to the server's root, TGI's route): greedy, the same text as /v1/completions on the same
prompt (each prompt opened by a nonce and the OpenAI request salted, so that neither reads the other's cached
blocks), with details; TGI's token stream; /generate and /generate_stream beside SGLang's /generate; /info."""
from __future__ import annotations

import json
import uuid

import httpx
import pytest
from huggingface_hub import InferenceClient

from tests.helpers.http_calls import MODEL


@pytest.fixture(scope="module")
def hf(server) -> InferenceClient:
    return InferenceClient(model=server.base_url, timeout=120)


def prompt() -> str:
    return f"Note {uuid.uuid4().hex}. The three largest cities of France are"


def reference(client, text: str, max_tokens: int = 10):
    return client.completions.create(model=MODEL, prompt=text, max_tokens=max_tokens, temperature=0,
                                     extra_body={"cache_salt": uuid.uuid4().hex})


def test_text_generation_is_the_completions_greedy_text(hf, client, tokenizer):
    text = prompt()
    out = hf.text_generation(text, max_new_tokens=10, details=True)  # do_sample false: greedy, as TGI's
    plain = reference(client, text)
    assert out.generated_text == plain.choices[0].text
    assert out.details.generated_tokens == plain.usage.completion_tokens == len(out.details.tokens)
    assert out.details.finish_reason == ("length" if plain.choices[0].finish_reason == "length" else "eos_token")
    assert tokenizer.decode([t.id for t in out.details.tokens], skip_special_tokens=True) == out.generated_text
    assert all(t.logprob <= 0 for t in out.details.tokens)
    other = prompt()
    full = hf.text_generation(other, max_new_tokens=4, return_full_text=True)
    assert full.startswith(other) and len(full) > len(other)


def test_the_token_stream(hf, client):
    text = prompt()
    events = list(hf.text_generation(text, max_new_tokens=10, stream=True, details=True))
    assert [e.generated_text is not None for e in events] == [False] * (len(events) - 1) + [True]
    assert all(isinstance(e.token.id, int) and e.token.logprob <= 0 for e in events)
    last = events[-1]
    assert last.generated_text == reference(client, text).choices[0].text and last.details.generated_tokens == 10
    assert "".join(e.token.text for e in events if not e.token.special) == last.generated_text


def test_generate_and_generate_stream_share_the_path_with_sglang(server):
    body = {"inputs": prompt(), "parameters": {"max_new_tokens": 4, "details": True}}
    tgi = httpx.post(f"{server.base_url}/generate", json=body, timeout=120).json()
    assert set(tgi) == {"generated_text", "details"} and tgi["details"]["generated_tokens"] == 4
    sglang = httpx.post(f"{server.base_url}/generate", json={"text": body["inputs"],
                                                              "sampling_params": {"max_new_tokens": 4}}, timeout=120)
    assert "meta_info" in sglang.json()  # the same path, SGLang's body
    with httpx.stream("POST", f"{server.base_url}/generate_stream", json=body, timeout=120) as s:
        lines = [json.loads(line[5:]) for line in s.iter_lines() if line.startswith("data:")]
    assert [e["index"] for e in lines] == list(range(len(lines))) and lines[-1]["details"]["finish_reason"]
    info = httpx.get(f"{server.base_url}/info", timeout=30).json()
    assert info["model_id"] == MODEL and info["max_total_tokens"] == 2048


@pytest.mark.parametrize("parameters,param", [
    ({"max_new_tokens": 10**9}, "parameters.max_new_tokens"),
    ({"watermark": True}, "parameters.watermark"),
    ({"best_of": 2}, "parameters.best_of"),
    ({"grammar": {"type": "json", "value": {"type": "no-such"}}}, "parameters.grammar"),
    ({"temperature": 0}, "parameters.temperature"),
    ({"truncate": 10**6}, "parameters.truncate"),
])
def test_bad_parameters_name_the_field(server, parameters, param):
    r = httpx.post(f"{server.base_url}/generate", json={"inputs": "Hi", "parameters": parameters}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
