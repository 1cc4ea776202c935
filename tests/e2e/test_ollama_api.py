"""Ollama's API on the shared server, through Ollama's own Python client: chat and generate give the OpenAI routes'
greedy text (each prompt opened by a nonce and the OpenAI request salted, so that neither reads the other's
cached blocks), streamed as NDJSON; structured output, embeddings, the model listings, and Ollama's errors."""
from __future__ import annotations

import json
import uuid

import httpx
import numpy as np
import ollama
import pytest

from tests.helpers.http_calls import MODEL

GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def api(server) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120)


def nonce_messages(question: str = "Name three rivers of Europe.") -> list[dict]:
    return [{"role": "system", "content": f"Session {uuid.uuid4().hex}. Be brief."},
            {"role": "user", "content": question}]


def salted() -> dict:
    return {"cache_salt": uuid.uuid4().hex}


def test_chat_is_the_openai_routes_greedy_answer(api, client):
    messages = nonce_messages()
    answer = api.chat(model=MODEL, messages=messages, options=GREEDY, stream=False)
    openai_answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                   extra_body=salted())
    assert answer.message.role == "assistant" and answer.message.content == openai_answer.choices[0].message.content
    # the same length and reason as the OpenAI route's (this CPU's greedy answer may end before 12 tokens)
    assert answer.done and answer.eval_count == openai_answer.usage.completion_tokens
    assert answer.done_reason == ("length" if openai_answer.choices[0].finish_reason == "length" else "stop")
    assert answer.prompt_eval_count == openai_answer.usage.prompt_tokens
    assert answer.total_duration >= answer.eval_duration > 0
    streamed_messages = nonce_messages()
    chunks = list(api.chat(model=MODEL + ":latest", messages=streamed_messages, options=GREEDY, stream=True))
    reference = client.chat.completions.create(model=MODEL, messages=streamed_messages, max_tokens=12, temperature=0,
                                               extra_body=salted())
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].eval_count == reference.usage.completion_tokens
    assert "".join(c.message.content for c in chunks) == reference.choices[0].message.content


def test_generate_with_the_template_and_raw(api, client, tokenizer):
    system = f"Session {uuid.uuid4().hex}. Be brief."
    answer = api.generate(model=MODEL, prompt="Name a colour.", system=system, options=GREEDY)
    reference = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}],
        max_tokens=12, temperature=0, extra_body=salted())
    assert answer.response == reference.choices[0].message.content
    assert answer.eval_count == reference.usage.completion_tokens
    assert answer.done_reason == ("length" if reference.choices[0].finish_reason == "length" else "stop")
    assert len(answer.context) == answer.prompt_eval_count + answer.eval_count  # the prompt's ids, then the output's
    prompt = f"Session {uuid.uuid4().hex}. The capital of France is"
    raw = api.generate(model=MODEL, prompt=prompt, raw=True, options=GREEDY)
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body=salted())
    assert raw.response == plain.choices[0].text and raw.context[:raw.prompt_eval_count] == tokenizer.encode(prompt).ids
    loaded = api.generate(model=MODEL, prompt="")  # how Ollama's clients load a model
    assert loaded.done and loaded.done_reason == "load"


def test_format_follows_a_json_schema(api):
    schema = {"type": "object", "properties": {"river": {"type": "string", "maxLength": 20}}, "required": ["river"],
              "additionalProperties": False}
    answer = api.chat(model=MODEL, messages=nonce_messages("Name one river as JSON."), format=schema,
                      options={"temperature": 0.7, "seed": 1, "num_predict": 60})
    assert set(json.loads(answer.message.content)) == {"river"} and answer.done_reason == "stop"


def test_embeddings_are_the_openai_routes(api, client):
    texts = ["The sea is calm.", "Bread is made of flour."]
    vectors = api.embed(model=MODEL, input=texts).embeddings
    reference = [d.embedding for d in client.embeddings.create(model=MODEL, input=texts, encoding_format="float").data]
    assert np.allclose(vectors, reference, atol=1e-5)
    older = api.embeddings(model=MODEL, prompt=texts[0]).embedding
    assert np.allclose(older, reference[0], atol=1e-5)


def test_the_model_listings(api, server):
    listed = api.list().models
    assert [m.model for m in listed] == [MODEL] and listed[0].details.family == "llama"
    shown = api.show(MODEL)
    assert {"completion", "embedding"} <= set(shown.capabilities) and "im_start" in shown.template
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == 2048
    assert [m.model for m in api.ps().models] == [MODEL]
    version = httpx.get(f"{server.base_url}/api/version", timeout=30).json()["version"]
    assert version and version == httpx.get(f"{server.base_url}/version", timeout=30).json()["version"]


def test_errors_take_ollamas_shape(api, server):
    with pytest.raises(ollama.ResponseError) as exc:
        api.chat(model="no-such-model", messages=nonce_messages())
    assert exc.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as exc:
        api.chat(model=MODEL, messages=nonce_messages(), options={"temperature": 7})
    assert exc.value.status_code == 400 and "temperature" in exc.value.error
    for body, param in (({"model": MODEL, "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
                        ({"model": MODEL, "prompt": "x", "options": {"num_predict": 10**9}}, "options.num_predict"),
                        ({"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix"),
                        ({"model": MODEL, "prompt": "x", "images": ["aGk="]}, "images"),
                        ({"model": MODEL, "prompt": "x", "format": "yaml"}, "format")):
        r = httpx.post(f"{server.base_url}/api/generate", json={**body, "stream": False}, timeout=60)
        assert r.status_code == 400 and set(r.json()) == {"error"} and param in r.json()["error"], (body, r.text)
