"""NVIDIA Dynamo's `nvext` through a real `rill serve`: overrides, stream annotations, response fields."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Reply with one word: yes or no?"}]
STORY = [{"role": "user", "content": "Tell a long story about a cat and a dog."}]


def chat(server, **fields) -> dict:
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, **fields}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def text_of(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def sse(server, path: str, body: dict) -> list[tuple[str | None, str]]:
    """(event name, data or comment) per SSE event, in order; keep-alives left out."""
    events, name, lines = [], None, []
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "":
                if name or lines:
                    events.append((name, "\n".join(lines)))
                name, lines = None, []
            elif line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                lines.append(line[len("data: "):])
            elif line.startswith(": ") and line != ": keep-alive":
                lines.append(line[2:])
    return events


def test_sampling_overrides(server):
    greedy = text_of(chat(server, messages=STORY, max_tokens=16, temperature=0))
    for spelling in ("greed_sampling", "greedy_sampling"):
        forced = chat(server, messages=STORY, max_tokens=16, temperature=1.5, seed=7, nvext={spelling: True})
        assert text_of(forced) == greedy
    assert text_of(chat(server, messages=STORY, max_tokens=16, temperature=1.0, seed=3, nvext={"top_k": 1})) == greedy
    short = chat(server, messages=MESSAGES, max_tokens=32, temperature=0)
    assert short["usage"]["completion_tokens"] < 32  # ends by itself ...
    forced = chat(server, messages=MESSAGES, max_tokens=32, temperature=0, nvext={"ignore_eos": True})
    assert forced["usage"]["completion_tokens"] == 32 and forced["choices"][0]["finish_reason"] == "length"
    penalised = chat(server, messages=STORY, max_tokens=24, temperature=0, nvext={"repetition_penalty": 1.8})
    top_level = chat(server, messages=STORY, max_tokens=24, temperature=0, repetition_penalty=1.8)
    assert text_of(penalised) == text_of(top_level)
    assert text_of(penalised) != text_of(chat(server, messages=STORY, max_tokens=24, temperature=0))


def test_stream_annotations(server):
    started_ms = time.time() * 1000
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "stream": True,
            "nvext": {"annotations": ["token_ids", "formatted_prompt", "timing"]}}
    events = sse(server, "/v1/chat/completions", body)
    names = [name for name, _ in events]
    assert names[:2] == ["token_ids", "formatted_prompt"] and names[-2:] == ["timing", None]
    assert events[-1][1] == "[DONE]"
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"messages": MESSAGES}, timeout=60).json()["tokens"]
    assert json.loads(events[0][1]) == tokens
    assert json.loads(events[1][1]).startswith("<|im_start|>") and "yes or no" in json.loads(events[1][1])
    timing = json.loads(events[-2][1])
    assert started_ms - 1000 <= timing["request_received_ms"] <= time.time() * 1000
    assert 0 < timing["prefill_time_ms"] and 0 <= timing["prefill_wait_time_ms"]
    assert 0 < timing["ttft_ms"] <= timing["total_time_ms"]
    chunks = [json.loads(data) for name, data in events if name is None and data != "[DONE]"]
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_timing_field_with_the_sdk(client):
    kwargs = dict(model=MODEL, messages=MESSAGES, max_tokens=4, extra_body={"nvext": {"extra_fields": ["timing"]}})
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert all("nvext" not in (c.model_extra or {}) for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and 0 < last.model_extra["nvext"]["timing"]["ttft_ms"]
    plain = client.chat.completions.create(**kwargs)
    timing = plain.model_extra["nvext"]["timing"]
    assert 0 < timing["ttft_ms"] <= timing["total_time_ms"]


def test_completions_annotations_in_a_plain_answer(server, tokenizer):
    body = {"model": MODEL, "prompt": ["One, two,", "Red, green,"], "max_tokens": 3,
            "nvext": {"use_raw_prompt": True, "annotations": ["token_ids"], "extra_fields": ["timing"]}}
    answer = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    assert answer["nvext"]["token_ids"] == [tokenizer.encode(p).ids for p in body["prompt"]]
    assert answer["nvext"]["timing"]["total_time_ms"] > 0
    validate("CreateCompletionResponse", answer)


@pytest.mark.parametrize("nvext,param", [
    ({"annotations": ["llm_metrics"]}, "nvext.annotations[0]"),
    ({"extra_fields": ["timing", "worker_id"]}, "nvext.extra_fields[1]"),
    ({"backend_instance_id": 3}, "nvext"),
    ({"top_k": "1"}, "nvext.top_k"),
    ({"repetition_penalty": 0}, "nvext.repetition_penalty"),
    ({"use_raw_prompt": True}, "nvext.use_raw_prompt"),
    ("yes", "nvext"),
])
def test_bad_nvext(server, nvext, param):
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "stream": True, "nvext": nvext})
    assert resp.status_code == 400, resp.text
    validate("ErrorResponse", resp.json())
    assert resp.json()["error"]["param"] == param
