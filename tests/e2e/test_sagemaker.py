"""SageMaker's routes on the shared server: /ping as /ready, and /invocations serving each body as the route its
keys name serves it, read back by the OpenAI SDK (strict) and checked against OpenAI's spec."""
from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}
PROMPT = {"model": MODEL, "prompt": "The sky is", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def root_sdk(server) -> openai.OpenAI:
    """The SDK at the server's root (SageMaker's paths are not under /v1), validating every response."""
    return openai.OpenAI(base_url=server.base_url, api_key="unused", _strict_response_validation=True, max_retries=0,
                         timeout=120)


def test_ping_answers_as_ready(server):
    assert httpx.get(f"{server.base_url}/ping").status_code == 200
    assert httpx.post(f"{server.base_url}/ping").status_code == 200


def test_a_chat_body_is_a_chat_completion(server, client, root_sdk):
    invoked = root_sdk.post("/invocations", cast_to=ChatCompletion, body=CHAT)
    direct = client.chat.completions.create(**CHAT)
    assert invoked.object == "chat.completion" and invoked.choices[0].message.content
    assert invoked.choices[0].message.content == direct.choices[0].message.content
    validate("CreateChatCompletionResponse", httpx.post(f"{server.base_url}/invocations", json=CHAT, timeout=60).json())


def test_a_prompt_body_is_a_completion_streamed_or_not(server, client, root_sdk):
    invoked = root_sdk.post("/invocations", cast_to=Completion, body=PROMPT)
    assert invoked.choices[0].text == client.completions.create(**PROMPT).choices[0].text
    with httpx.stream("POST", f"{server.base_url}/invocations", json={**PROMPT, "stream": True}, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == invoked.choices[0].text


def test_an_input_body_is_an_embedding(server, root_sdk):
    body = {"model": MODEL, "input": ["red", "blue"]}
    invoked = root_sdk.post("/invocations", cast_to=CreateEmbeddingResponse, body=body)
    # (the SDK's own embeddings.create asks for base64, which its strict validation reads before decoding)
    direct = httpx.post(f"{server.base_url}/v1/embeddings", json=body, timeout=60).json()
    assert np.allclose([e.embedding for e in invoked.data], [e["embedding"] for e in direct["data"]], atol=1e-5)


def test_bad_bodies_are_400s(server):
    url = f"{server.base_url}/invocations"
    nothing = httpx.post(url, json={"model": MODEL}, timeout=30)
    assert nothing.status_code == 400 and "`prompt` (completions)" in nothing.json()["error"]["message"]
    not_an_object = httpx.post(url, content=b"[1]", headers={"content-type": "application/json"}, timeout=30)
    assert not_an_object.status_code == 400 and not_an_object.json()["error"]["code"] == "invalid_json"
    # A rerank body reaches the rerank route, whose own check answers: this model generates, it does not rerank.
    rerank = httpx.post(url, json={"query": "Hi", "documents": ["Hello"]}, timeout=30)
    assert rerank.status_code == 400 and rerank.json()["error"]["param"] == "model"
    # The chat route's own bounds hold there too.
    too_many = httpx.post(url, json={**CHAT, "max_tokens": -1}, timeout=30)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"
    assert httpx.get(url, timeout=30).status_code == 405
