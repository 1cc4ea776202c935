"""End to end: `rill serve --speculative-config` (ngram) through the OpenAI SDK: greedy texts equal to
the model's own without speculation, streams with stop strings and logprobs, structured outputs and
`n`, and the acceptance counters in /stats and /metrics."""
from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest
import torch
from openai import OpenAI

from tests.helpers.generation import BLOCK_SIZE, EOS_ID, generate
from tests.helpers.openapi import validate
from tests.helpers.runners import make_runner
from tests.helpers.server import sdk_client, start_server, stop_server

MODEL = "smollm2-135m-instruct"
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
COPY = ("Repeat this text exactly, word for word: The quick brown fox jumps over the lazy dog near the "
        "bank of the river, and the dog does not move at all.")
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    return [tokenizer.encode(chat.format(COPY)).ids, tokenizer.encode(chat.format("Name three colors.")).ids]


@pytest.fixture(scope="module")
def expected(model_dir, tokenizer, prompts) -> list[str]:
    """The greedy texts without speculation, from a float32 runner in this process."""

    runner = make_runner(model_dir, dtype=torch.float32, num_kv_blocks=32, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID])
    return [tokenizer.decode(ids) for ids in generate(runner, prompts, max_tokens=MAX_TOKENS)]


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    srv = start_server(tmp_path_factory, "--dtype", "float32", "--max-model-len", "1024",
                       "--speculative-config", SPEC)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(spec_server) -> OpenAI:
    return sdk_client(spec_server)


def test_greedy_texts_are_the_models_own(spec_server, client, prompts, expected):
    def one(ids):
        r = httpx.post(f"{spec_server.base_url}/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "min_tokens": MAX_TOKENS})
        assert r.status_code == 200, r.text
        validate("CreateCompletionResponse", r.json())
        return r.json()

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:  # batched together in the engine
        bodies = list(pool.map(one, prompts))
    assert [b["choices"][0]["text"] for b in bodies] == expected
    assert all(b["usage"]["completion_tokens"] == MAX_TOKENS for b in bodies)
    stats = httpx.get(f"{spec_server.base_url}/stats").json()
    assert stats["speculative"] == "ngram k=4 n=2..4"
    assert stats["num_spec_accepted_tokens"] > 0 and 0 < stats["spec_acceptance_rate"] <= 1
    metrics = httpx.get(f"{spec_server.base_url}/metrics").text
    for name in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total"):
        assert f"rill:{name}{{" in metrics  # vLLM's names under --metrics-prefix
    assert 'rill:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2-135m-instruct",position="0"}' in metrics


def test_a_stream_stops_at_a_stop_string_inside_a_step_of_drafts(client, prompts, expected):
    """Drafts make a step stream several tokens at once: the stop string still cuts the text."""
    stop = expected[0][len(expected[0]) // 2:][:6]
    text, finishes = "", []
    # The SDK's strict Completion type rejects a streamed chunk's finish_reason null (see test_api).
    lenient = client.with_options()
    lenient._strict_response_validation = False
    for chunk in lenient.completions.create(model=MODEL, prompt=prompts[0], max_tokens=MAX_TOKENS, temperature=0,
                                           stop=[stop], stream=True):
        text += chunk.choices[0].text
        finishes.append(chunk.choices[0].finish_reason)
    assert text == expected[0][: expected[0].index(stop)]
    assert finishes[-1] == "stop"


def test_logprobs_count_every_token_kept(client, prompts, expected):
    r = client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=24, temperature=0, logprobs=2,
                                  extra_body={"min_tokens": 24})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens == 24
    assert "".join(lp.tokens) == r.choices[0].text
    assert r.choices[0].text == expected[0][: len(r.choices[0].text)]


def test_structured_output_and_n_still_work(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give a JSON object with a name and an age."}],
        response_format={"type": "json_object"}, n=2, seed=3, temperature=0.8, max_tokens=60)
    assert len(r.choices) == 2
    for choice in r.choices:
        assert choice.message.content.lstrip().startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)


def test_a_prediction_drafts_first_and_leaves_the_text_the_models_own(client):
    """Predicted outputs beside ngram drafts: wherever the prediction is right, wrong or edited, greedy text is
    the same, and only a right prediction is accepted."""
    ask = [{"role": "user", "content": COPY}]

    def chat(prediction: str | None):
        extra = {} if prediction is None else {"prediction": {"type": "content", "content": prediction}}
        return client.chat.completions.create(model=MODEL, messages=ask, max_tokens=MAX_TOKENS, temperature=0,
                                              **extra)

    plain = chat(None)
    text = plain.choices[0].message.content
    edited = text.replace("fox", "cat").replace("river", "lake")
    assert edited != text
    for prediction in (text, edited, "Nothing like the answer at all, " * 8):
        resp = chat(prediction)
        assert resp.choices[0].message.content == text
        details = resp.usage.completion_tokens_details
        if prediction == text:
            assert details.accepted_prediction_tokens >= resp.usage.completion_tokens // 2
        if prediction.startswith("Nothing"):
            assert details.accepted_prediction_tokens == 0
