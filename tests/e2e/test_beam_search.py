"""End to end: vLLM's `use_beam_search` through the OpenAI SDK, on a float32 server of the bundled model:
the beams are transformers' `generate(num_beams=...)` beams for the same prompt, best first, in chat and
completions, streamed as not; logprobs and usage; the steps hit the prefix cache; what a beam search
cannot honour is a 400 naming it."""
from __future__ import annotations

import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.openapi import validate
from tests.helpers.server import sdk_client, start_server, stats, stop_server

MODEL = "smollm2-135m-instruct"
# Longer than two KV blocks (16 tokens each): each step's beams find the prompt's blocks in the cache.
PROMPT = ("A long hike in the mountains takes planning: the weather can turn, the trail can be steep, and water "
          "can be scarce. The three most useful things to pack for such a hike are")


@pytest.fixture(scope="module")
def beam_server(tmp_path_factory):
    srv = start_server(tmp_path_factory, "--dtype", "float32", "--max-model-len", "1024")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(beam_server):
    return sdk_client(beam_server)


@pytest.fixture(scope="module")
def hf(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_beams(hf, prompt_ids: list[int], width: int, max_tokens: int, **options) -> list[tuple[list[int], str]]:
    """transformers' beams: each one's tokens (its end token left out) and finish reason, best first."""
    end_ids = hf.generation_config.eos_token_id
    end_ids = set(end_ids if isinstance(end_ids, list) else [end_ids])
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt_ids]), num_beams=width, num_return_sequences=width, do_sample=False,
                          max_new_tokens=max_tokens, pad_token_id=min(end_ids), **options)
    beams = []
    for seq in out.tolist():
        tokens = seq[len(prompt_ids):]
        end = next((i for i, t in enumerate(tokens) if t in end_ids), None)
        beams.append((tokens, "length") if end is None else (tokens[:end], "stop"))
    return beams


def test_completions_beams_are_transformers_own(beam_server, client, hf, tokenizer):
    before = stats(beam_server)
    r = client.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=16, logprobs=2,
                                  extra_body={"use_beam_search": True, "return_token_ids": True})
    validate("CreateCompletionResponse", r.model_dump(exclude_unset=True, exclude={"choices": {"__all__": {"token_ids"}}}))
    expected = hf_beams(hf, tokenizer.encode(PROMPT).ids, 3, 16)
    assert [(c.model_extra["token_ids"][: len(ids)], c.finish_reason) for c, (ids, _) in zip(r.choices, expected)] \
        == expected
    assert [c.text for c in r.choices] == [tokenizer.decode(ids) for ids, _ in expected]
    assert len({c.text for c in r.choices}) == 3 and [c.index for c in r.choices] == [0, 1, 2]
    for choice in r.choices:  # each token's logprob and the step's top 2
        assert len(choice.logprobs.tokens) == len(choice.model_extra["token_ids"])
        assert all(len(top) >= 2 for top in choice.logprobs.top_logprobs)
    assert r.usage.prompt_tokens == len(tokenizer.encode(PROMPT).ids)
    assert r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)
    # each step after the first found at least the prompt's full blocks in the cache
    assert r.usage.prompt_tokens > 32
    num_steps = min(len(c.model_extra["token_ids"]) for c in r.choices)
    hits = stats(beam_server)["num_prefix_hit_tokens"] - before["num_prefix_hit_tokens"]
    assert hits >= (num_steps - 1) * (r.usage.prompt_tokens // 16 * 16)


def test_chat_beams_streamed_and_not_with_a_length_penalty(client, hf):
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Name a fruit that is red."}], n=2,
                max_completion_tokens=24, extra_body={"use_beam_search": True, "length_penalty": 0.5,
                                                      "return_token_ids": True})
    whole = client.chat.completions.create(**body)
    validate("CreateChatCompletionResponse", whole.model_dump(exclude_unset=True, exclude={
        "prompt_token_ids": True, "choices": {"__all__": {"token_ids"}}}))
    expected = hf_beams(hf, whole.model_extra["prompt_token_ids"], 2, 24, length_penalty=0.5)
    assert [(c.model_extra["token_ids"][: len(ids)], c.finish_reason) for c, (ids, _) in zip(whole.choices, expected)] \
        == expected
    texts, finishes = ["", ""], [None, None]
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
    assert texts == [c.message.content for c in whole.choices]
    assert finishes == [c.finish_reason for c in whole.choices]


def test_one_beam_without_ends_is_the_greedy_answer(client):
    common = dict(model=MODEL, prompt=PROMPT, max_tokens=12, extra_body={"ignore_eos": True})
    greedy = client.completions.create(**common, temperature=0)
    beam = client.completions.create(**{**common, "extra_body": {"ignore_eos": True, "use_beam_search": True}})
    assert beam.choices[0].text == greedy.choices[0].text and beam.choices[0].finish_reason == "length"


@pytest.mark.parametrize("extra,param", [
    ({"stop": ["\n"]}, "stop"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
    ({"n": 11}, "n"),  # 22 top logprobs a step, past --max-logprobs 20
    ({"length_penalty": 100}, "length_penalty"),
])
def test_what_a_beam_search_cannot_honour_is_a_400_naming_it(beam_server, extra, param):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "use_beam_search": True, **extra}
    r = httpx.post(f"{beam_server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_beams_in_all_are_bounded(beam_server):
    """prompts x n past 64 beams is a 400 naming the prompt list, before any step runs."""
    body = {"model": MODEL, "prompt": ["a"] * 9, "n": 8, "max_tokens": 2, "use_beam_search": True}
    r = httpx.post(f"{beam_server.base_url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    ok = httpx.post(f"{beam_server.base_url}/v1/completions", json={**body, "prompt": ["a"] * 8}, timeout=60)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 64, ok.text



def test_a_client_that_leaves_ends_the_search(beam_server):
    """The search stops at the step the client left in: no step runs after, none is left queued."""
    body = {"model": MODEL, "prompt": PROMPT, "n": 4, "max_tokens": 500, "ignore_eos": True, "stream": True,
            "use_beam_search": True}
    with httpx.stream("POST", f"{beam_server.base_url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        deadline = time.monotonic() + 60
        while stats(beam_server)["num_finished"] < 8 and time.monotonic() < deadline:  # a few steps ran
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while (figures := stats(beam_server))["num_running"] + figures["num_waiting"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert figures["num_running"] == figures["num_waiting"] == 0
    time.sleep(0.5)  # no later step was submitted
    assert stats(beam_server)["num_finished"] + stats(beam_server)["num_aborted"] == \
        figures["num_finished"] + figures["num_aborted"]
