"""End to end: OpenAI's Predicted Outputs (`prediction` on chat completions) on the shared server, which has no
--speculative-config: the engine drafts from the prediction alone, and usage reports the tokens it accepted and
rejected, streamed or not. (That the text is the model's own, with or without a prediction, is checked on the
float32 server of test_speculative.py, where batch shapes cannot move a greedy choice.)"""
from __future__ import annotations

import httpx
import pytest

from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"
CODE = '''def total(items):
    result = 0
    for item in items:
        result += item.price * item.quantity
    return result
'''
ASK = [{"role": "user", "content": f"Rename `result` to `amount` in this function:\n\n```python\n{CODE}```"}]
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def answer(client) -> str:
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS,
                                          temperature=0).choices[0].message.content


def test_a_prediction_of_the_answer_is_accepted(client, answer):
    resp = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                          prediction={"type": "content", "content": answer})
    details = resp.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens is not None
    # Drafted and kept: all but the tokens each step samples itself (a few steps' worth).
    assert details.accepted_prediction_tokens >= resp.usage.completion_tokens // 2
    assert details.rejected_prediction_tokens <= 16  # at most the last step's drafts, past the end


def test_usage_counts_predicted_tokens_in_a_stream_and_for_each_choice(server, answer):
    body = {"model": MODEL, "messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0, "n": 2,
            "prediction": {"type": "content", "content": [{"type": "text", "text": answer[:40]},
                                                          {"type": "text", "text": answer[40:]}]}}
    plain = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120).json()
    validate("CreateChatCompletionResponse", plain)
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", timeout=120,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        usage = [line for line in r.iter_lines() if '"usage":{' in line]
    streamed = httpx.Response(200, content=usage[-1].removeprefix("data: ")).json()["usage"]
    details = plain["usage"]["completion_tokens_details"]
    assert streamed == plain["usage"]
    assert details["accepted_prediction_tokens"] >= plain["usage"]["completion_tokens"] // 2  # both choices'
    assert len(plain["choices"]) == 2


def test_no_prediction_no_details(server):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, "temperature": 0}
    usage = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120).json()["usage"]
    assert "completion_tokens_details" not in usage


@pytest.mark.parametrize("prediction,param", [
    ({"type": "text", "content": "x"}, "prediction.type"),
    ({"type": "content"}, "prediction"),
    ({"type": "content", "content": [{"type": "image_url", "text": "x"}]}, "prediction.content"),
    ({"type": "content", "content": 7}, "prediction.content"),
    ("def f(): pass", "prediction"),
])
def test_a_bad_prediction_is_a_400_naming_it(server, prediction, param):
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": ASK, "max_tokens": 2, "prediction": prediction})
    assert r.status_code == 400, r.text
    validate("ErrorResponse", r.json())
    assert r.json()["error"]["param"].startswith(param), r.json()
