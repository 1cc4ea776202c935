"""End to end: prompt logprobs. Completions' `echo` with `logprobs` (and `max_tokens: 0` to score
only, as lm-evaluation-harness's local-completions does), vLLM's `prompt_logprobs` on completions
and chat, and their 400s. The values themselves are checked against transformers in
tests/model/test_prompt_logprobs.py; here, against what the same server says elsewhere."""
from __future__ import annotations

import math

import openai
import pytest

from tests.helpers.http_calls import HELLO, MODEL, post, stream_chunks
from tests.helpers.openapi import validate

TEXT = "The sea is calm tonight, and the moon is bright over the water."
# Two code paths (a decode step, a prefill) or two batches agree to this in bfloat16: their GEMM
# kernels differ by row count, and a bfloat16 logit between 16 and 32 is rounded to steps of 0.125
# (seen on a Zen 4: 0.139 apart at one position of a 14- and a 15-token prefill). A logprob of the
# wrong token or position is off by far more.
BF16_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def lax_client(server):
    """The SDK's default (non-strict) parsing: its Logprobs type has no null, which OpenAI's legacy
    API (and vLLM) return for the first prompt token's logprob."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def score(server, prompt, **extra) -> dict:
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True,
                                         "logprobs": 2, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_with_max_tokens_0_scores_the_prompt_and_generates_nothing(server, lax_client, tokenizer):
    ids = tokenizer.encode(TEXT).ids
    body = score(server, TEXT)
    choice = body["choices"][0]
    assert choice["text"] == TEXT and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(ids)
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == TEXT and len(lp["tokens"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # as OpenAI's legacy API
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(ids))]
    for token, logprob, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert 2 <= len(top) <= 3 and top[token] == logprob and max(top.values()) >= logprob
    sdk = lax_client.completions.create(model=MODEL, prompt=TEXT, max_tokens=0, echo=True, logprobs=2)
    assert sdk.choices[0].logprobs.token_logprobs == lp["token_logprobs"]


def test_a_prompt_token_scores_as_the_same_token_generated(server, client, tokenizer):
    """Greedy: the token generated after a prompt (a decode step's logprob) scored as the last
    token of prompt + it (a prefill's)."""
    ids = tokenizer.encode(TEXT).ids
    gen = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logprobs=1)
    token, logprob = gen.choices[0].logprobs.tokens[0], gen.choices[0].logprobs.token_logprobs[0]
    alone = score(server, ids)["choices"][0]["logprobs"]
    scored = score(server, ids + [gen_id(tokenizer, gen)])["choices"][0]["logprobs"]
    assert scored["tokens"][-1] == token
    assert abs(scored["token_logprobs"][-1] - logprob) < BF16_TOLERANCE
    assert scored["top_logprobs"][-1][token] == max(scored["top_logprobs"][-1].values())  # it was the argmax
    assert scored["token_logprobs"][1:-1] == pytest.approx(alone["token_logprobs"][1:], abs=BF16_TOLERANCE)


def gen_id(tokenizer, gen) -> int:
    """The generated token's id: the one whose text is the generated text (asserted unique)."""
    text = gen.choices[0].text
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_echo_logprobs_stream_joins_into_the_body(server):
    body = {"prompt": TEXT, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1}
    whole = post(server, "/v1/completions", {"model": MODEL, **body}).json()
    chunks = stream_chunks(server, "/v1/completions", body)
    first = chunks[0]["choices"][0]
    assert first["text"].startswith(TEXT) and first["logprobs"]["token_logprobs"][0] is None
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        for key in joined:
            joined[key] += chunk["choices"][0]["logprobs"][key]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert joined["tokens"] == whole["choices"][0]["logprobs"]["tokens"]
    assert joined["text_offset"] == whole["choices"][0]["logprobs"]["text_offset"]
    assert len(joined["tokens"]) == whole["usage"]["prompt_tokens"] + 4


def test_vllm_prompt_logprobs_on_completions_and_chat(server, client, tokenizer):
    echo = score(server, TEXT)["choices"][0]["logprobs"]
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": TEXT, "max_tokens": 1, "prompt_logprobs": 2})
    body = r.json()
    validate("CreateCompletionResponse", body)  # an extra field; the rest as OpenAI's
    scores = body["choices"][0]["prompt_logprobs"]
    ids = tokenizer.encode(TEXT).ids
    assert len(scores) == len(ids) and scores[0] is None
    for token_id, logprob, entry in zip(ids[1:], echo["token_logprobs"][1:], scores[1:]):
        own = entry[str(token_id)]
        assert own["rank"] >= 1 and own["decoded_token"] == tokenizer.decode([token_id])
        assert abs(own["logprob"] - logprob) < BF16_TOLERANCE
        assert 2 <= len(entry) <= 3 and {1, 2} <= {v["rank"] for v in entry.values()}
    chat = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, extra_body={"prompt_logprobs": 0})
    listed = chat.model_extra["prompt_logprobs"]
    assert len(listed) == chat.usage.prompt_tokens and listed[0] is None
    assert all(len(entry) == 1 and next(iter(entry.values()))["logprob"] <= 0 for entry in listed[1:])
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
    assert "prompt_logprobs" not in (plain.model_extra or {})


def test_a_cached_prompt_is_scored_whole(server, client):
    """The prompt in the prefix cache first: scoring it again recomputes every position, and reports
    no cached tokens."""
    prompt = TEXT * 4  # several full blocks
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    cached = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert cached.usage.prompt_tokens_details.cached_tokens > 0
    first = score(server, prompt)
    again = score(server, prompt)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    values = first["choices"][0]["logprobs"]["token_logprobs"]
    assert len(values) == first["usage"]["prompt_tokens"] and all(v is not None for v in values[1:])
    assert again["choices"][0]["logprobs"]["token_logprobs"][1:] == pytest.approx(values[1:], abs=1e-5)


def test_a_likely_continuation_scores_higher_than_an_unlikely_one(server):
    """A log-likelihood task as an evaluation harness runs it: sum the continuation's logprobs."""
    context = "One, two, three, four,"

    def loglikelihood(continuation: str) -> float:
        lp = score(server, context + continuation)["choices"][0]["logprobs"]
        start = next(i for i, off in enumerate(lp["text_offset"]) if off >= len(context))
        return math.fsum(lp["token_logprobs"][start:])

    assert loglikelihood(" five") > loglikelihood(" banana") + 2


@pytest.mark.parametrize("extra,param", [
    ({"max_tokens": 0}, "max_tokens"),  # without echo: nothing to do
    ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),  # not streamed, as vLLM
])
def test_bad_prompt_logprobs_requests_are_400s(server, extra, param):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    validate("ErrorResponse", r.json())
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": HELLO, "prompt_logprobs": 1,
                                                 "stream": True})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "prompt_logprobs"
