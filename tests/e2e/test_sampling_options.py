"""End to end: n, logprobs and top_logprobs, echo, logit_bias, continuous usage stats, and their 400s."""
from __future__ import annotations

import openai
import pytest

from tests.helpers.http_calls import MODEL, post, stream_chunks
from tests.helpers.openapi import validate

HELLO = [{"role": "user", "content": "Tell me a story about the sea."}]
BANANA = 21285  # " banana" in SmolLM2's vocabulary


def lenient_completion_chunk(chunk: dict) -> dict:
    """The spec reuses the non-streamed schema for completion chunks, where finish_reason is not
    nullable; OpenAI streams null until a choice ends (see test_e2e_api)."""
    for c in chunk["choices"]:
        c["finish_reason"] = c["finish_reason"] or "length"
    return chunk


# ---- n ----------------------------------------------------------------------------------


def test_chat_n_choices_are_seeded_per_choice_and_count_the_prompt_once(server, client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=6, temperature=1.0)
    # The prompt in the prefix cache first, so that the two n=3 requests below are computed the
    # same way: a cold prompt and a cached one reach the first logits through other kernels (other
    # row counts, another attention call), and a draw near a boundary could sample differently.
    client.chat.completions.create(**kwargs, seed=1)
    three = client.chat.completions.create(**kwargs, n=3, seed=7)
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    assert len(set(texts)) > 1, texts  # choice j is seeded 7 + j: they differ...
    again = client.chat.completions.create(**kwargs, n=3, seed=7)
    assert [c.message.content for c in again.choices] == texts  # ...and are reproducible
    alone = client.chat.completions.create(**kwargs, seed=9)
    assert alone.choices[0].message.content == texts[2]  # vLLM's parallel sampling: seed + j
    assert three.usage.prompt_tokens == alone.usage.prompt_tokens  # once, however many choices
    assert three.usage.completion_tokens == 18 == 3 * alone.usage.completion_tokens
    assert three.usage.prompt_tokens_details.cached_tokens is not None
    validate("CreateChatCompletionResponse", post(server, "/v1/chat/completions",
                                                  {**kwargs, "n": 2, "seed": 1, "user": "u-1"}).json())


def test_chat_n_streams_one_choice_per_chunk_and_joins_into_the_body(server, client):
    body = dict(messages=HELLO, max_tokens=6, temperature=1.0, n=2, seed=3)
    full = client.chat.completions.create(model=MODEL, **body)
    chunks = stream_chunks(server, "/v1/chat/completions", body)
    texts, finishes = ["", ""], [None, None]
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
        assert len(chunk["choices"]) == 1  # as OpenAI and vLLM stream n > 1
        c = chunk["choices"][0]
        texts[c["index"]] += c["delta"].get("content") or ""
        finishes[c["index"]] = c["finish_reason"] or finishes[c["index"]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" == chunks[1]["choices"][0]["delta"]["role"]
    assert texts == [c.message.content for c in full.choices]
    assert finishes == [c.finish_reason for c in full.choices]


def test_completions_n_with_a_prompt_list_indexes_prompt_times_n_plus_j(client):
    prompts = ["The sea is", "Once upon a time"]
    both = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=5, temperature=0)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=0) for p in prompts]
    assert [c.text for c in both.choices] == [singles[0].choices[0].text] * 2 + [singles[1].choices[0].text] * 2
    assert both.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert both.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)


# ---- chat logprobs ------------------------------------------------------------------------


def test_chat_logprobs_and_top_logprobs_streamed_and_not(server, client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    resp = client.chat.completions.create(**kwargs)
    choice = resp.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == resp.usage.completion_tokens == 8
    assert "".join(e.token for e in entries) == choice.message.content
    assert bytes(b for e in entries for b in e.bytes).decode() == choice.message.content
    for e in entries:
        tops = e.top_logprobs
        assert len(tops) == 3 and [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert tops[0].token == e.token and tops[0].logprob == e.logprob <= 0  # greedy: the top one
        assert all(t.bytes == list(t.token.encode()) for t in tops if "\ufffd" not in t.token)
    raw = post(server, "/v1/chat/completions", kwargs).json()
    validate("CreateChatCompletionResponse", raw)
    assert raw["choices"][0]["logprobs"]["refusal"] is None
    streamed = []
    for chunk in stream_chunks(server, "/v1/chat/completions", {k: v for k, v in kwargs.items() if k != "model"}):
        validate("CreateChatCompletionStreamResponse", chunk)
        for c in chunk["choices"]:
            if c["logprobs"] is not None:
                streamed += c["logprobs"]["content"]
    assert streamed == raw["choices"][0]["logprobs"]["content"]


def test_chat_logprobs_without_top_logprobs_and_none_by_default(client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=3, temperature=0)
    plain = client.chat.completions.create(**kwargs)
    assert plain.choices[0].logprobs is None
    only = client.chat.completions.create(**kwargs, logprobs=True)
    assert [e.top_logprobs for e in only.choices[0].logprobs.content] == [[], [], []]


# ---- completions logprobs and echo ---------------------------------------------------------


def test_completions_legacy_logprobs_streamed_and_not(server, client):
    body = dict(prompt="The sea is", max_tokens=8, temperature=0, logprobs=2)
    resp = client.completions.create(model=MODEL, **body)
    lp = resp.choices[0].logprobs
    assert "".join(lp.tokens) == resp.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    offsets = [0]
    for token in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 2 <= len(top) <= 3 and top[token] == logprob == max(top.values())  # greedy
    raw = post(server, "/v1/completions", {"model": MODEL, **body}).json()
    validate("CreateCompletionResponse", raw)
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in stream_chunks(server, "/v1/completions", body):
        validate("CreateCompletionResponse", lenient_completion_chunk(chunk))
        for key in joined:
            joined[key] += chunk["choices"][0]["logprobs"][key]
    assert joined == raw["choices"][0]["logprobs"]


def test_completions_echo_prepends_the_prompt(server, client):
    resp = client.completions.create(model=MODEL, prompt=["The sea is", "A cat"], max_tokens=4, temperature=0,
                                     echo=True)
    plain = client.completions.create(model=MODEL, prompt=["The sea is", "A cat"], max_tokens=4, temperature=0)
    assert [c.text for c in resp.choices] == ["The sea is" + plain.choices[0].text, "A cat" + plain.choices[1].text]
    chunks = stream_chunks(server, "/v1/completions", dict(prompt="The sea is", max_tokens=4, temperature=0, echo=True))
    assert chunks[0]["choices"][0]["text"].startswith("The sea is")  # with the first token, as the role chunk
    assert "".join(c["choices"][0]["text"] for c in chunks) == resp.choices[0].text


# ---- logit_bias ---------------------------------------------------------------------------


def test_logit_bias_forces_and_bans_tokens(client, tokenizer):
    forced = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=3, temperature=0,
                                       logit_bias={str(BANANA): 100})
    assert forced.choices[0].text == " banana" * 3
    sampled = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, temperature=1.0, seed=5,
                                             logit_bias={str(BANANA): 100})
    assert sampled.choices[0].message.content == " banana" * 2
    greedy = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=1, temperature=0)
    [first_id] = tokenizer.encode(greedy.choices[0].text, add_special_tokens=False).ids
    banned = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=1, temperature=0,
                                       logit_bias={str(first_id): -100})
    assert banned.choices[0].text not in ("", greedy.choices[0].text)


# ---- options that existed before: stop_token_ids, include_stop_str_in_output, skip_special_tokens --


def test_stop_token_ids_and_include_stop_str_in_output(client, tokenizer):
    kwargs = dict(model=MODEL, prompt="The sea is", max_tokens=6, temperature=0)
    text = client.completions.create(**kwargs).choices[0].text
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    cut = client.completions.create(**kwargs, extra_body={"stop_token_ids": [ids[2]]}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == tokenizer.decode(ids[:2])
    stop = tokenizer.decode(ids[1:3]).strip()
    without = client.completions.create(**kwargs, stop=[stop]).choices[0].text
    kept = client.completions.create(**kwargs, stop=[stop], extra_body={"include_stop_str_in_output": True})
    assert not without.endswith(stop) and kept.choices[0].text == without + stop


def test_skip_special_tokens(client, tokenizer):
    special = "<jupyter_text>"
    kwargs = dict(model=MODEL, prompt="The sea is", max_tokens=2, temperature=0,
                  logit_bias={str(tokenizer.token_to_id(special)): 100})
    assert client.completions.create(**kwargs).choices[0].text == ""
    shown = client.completions.create(**kwargs, extra_body={"skip_special_tokens": False})
    assert shown.choices[0].text == special * 2


# ---- continuous usage stats ---------------------------------------------------------------


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": HELLO}),
    ("/v1/completions", {"prompt": "The sea is"}),
])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(server, path, body):
    chunks = stream_chunks(server, path, {**body, "max_tokens": 5, "temperature": 0,
                                          "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages)
    completion = [u["completion_tokens"] for u in usages]
    assert completion == sorted(completion) and completion[-1] == 5
    assert len({u["prompt_tokens"] for u in usages}) == 1 and usages[-1]["prompt_tokens_details"] is not None
    assert chunks[-1]["choices"] == []
    without = stream_chunks(server, path, {**body, "max_tokens": 2, "stream_options": {"include_usage": True}})
    assert [c["usage"] is None for c in without] == [True] * (len(without) - 1) + [False]


# ---- validation: 400 naming the parameter, before any stream byte ---------------------------

CHAT_BAD = [
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true (OpenAI refuses it)
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"n": 0}, "n"), ({"n": 129}, "n"),
    ({"temperature": 3}, "temperature"),
    ({"logit_bias": {"banana": 1}}, "logit_bias"), ({"logit_bias": {"1_0": 1}}, "logit_bias"),
    ({"logit_bias": {"49152": 1}}, "logit_bias"), ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"5": -100.5}}, "logit_bias"),
    ({"logit_bias": {"5": "x"}}, "logit_bias"),
]
COMPLETIONS_BAD = [
    ({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"),  # at most --max-logprobs (20), as vLLM
    ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo (score the prompt)
    ({"n": 0}, "n"), ({"logit_bias": {"x": 1}}, "logit_bias"), ({"best_of": 2, "n": 3}, "best_of"),  # best_of < n
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,extra,param", [("/v1/chat/completions", e, p) for e, p in CHAT_BAD]
                         + [("/v1/completions", e, p) for e, p in COMPLETIONS_BAD])
def test_bad_values_are_400_naming_the_parameter(server, path, extra, param, stream):
    base = {"messages": HELLO} if "chat" in path else {"prompt": "Hi"}
    r = post(server, path, {"model": MODEL, **base, "max_tokens": 2, **extra, "stream": stream})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")  # not a stream
    assert r.json()["error"]["param"] == param
    validate("ErrorResponse", r.json())


def test_the_sdk_sees_a_bad_request(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=HELLO, top_logprobs=3)
