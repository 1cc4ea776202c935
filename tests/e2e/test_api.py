"""End to end through a real `rill serve` with the openai SDK (strict) and the OpenAPI spec."""
from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import openai
import pytest

from tests.helpers.http_calls import HELLO, MODEL, post, sse_events
from tests.helpers.openapi import validate

# ---- models and health ----------------------------------------------------------------


def test_models_list_and_retrieve(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    validate("ListModelsResponse", httpx.get(f"{server.base_url}/v1/models").json())
    validate("Model", httpx.get(f"{server.base_url}/v1/models/{MODEL}").json())
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_stats_report_memory(server):
    """The KV cache is allocated once at its configured size (1 GiB by default) and held; peak RSS
    is the engine's high-water mark, so it covers the cache and the weights. The weights as loaded are
    the bundled model's 134.5 M parameters at 2 or 4 bytes each (bfloat16 or float32, as --dtype auto
    chose), the tied head at most once more (packed for the CPU's GEMM), and buffers such as the RoPE
tables (under 32 MB); the engine holds them resident now."""
    figures = httpx.get(f"{server.base_url}/stats").json()
    assert figures["kv_cache_bytes"] <= 1 << 30
    assert figures["kv_cache_bytes"] > 0.9 * (1 << 30)
    assert figures["peak_rss_bytes"] > figures["kv_cache_bytes"]
    width = {"bfloat16": 2, "float32": 4}[figures["dtype"]]
    assert 134.5e6 * width <= figures["weight_bytes"] <= (134.5e6 + 28.3e6) * width + 32e6, figures["weight_bytes"]
    # (not peak >= now: the peak is getrusage's, counted in KiB, the RSS /proc's, a moment apart)
    assert figures["rss_bytes"] > figures["weight_bytes"] and figures["peak_rss_bytes"] > figures["weight_bytes"]


def test_stats_say_which_dtype_auto_chose_and_why(server):
    """The default server runs --dtype auto: /stats names what this CPU got, as cpu_features decides."""
    from rill.engine_proc.cpu_features import auto_cpu_dtype, cpu_info

    figures = httpx.get(f"{server.base_url}/stats").json()
    assert (figures["dtype"], figures["dtype_reason"]) == auto_cpu_dtype()
    assert figures["cpu"] == cpu_info().summary() and figures["quantization"] == "none"
    assert figures["compiled_decode"] is True, "torch.compile failed at start: decode steps run eagerly"
    # The machines that run the tests have a C++ compiler (torch.compile needs one too).
    assert figures["attention_backend"] == "cpu", "the CPU decode kernel was not built: see the server log"


def test_health_and_ready(server):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/ready").status_code == 200


# ---- chat -----------------------------------------------------------------------------


def test_chat_non_streaming_matches_spec(server, client):
    resp = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=0)
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 24 and resp.usage.prompt_tokens > 5
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    raw = post(server, "/v1/chat/completions", {"model": MODEL, "messages": HELLO, "max_tokens": 8}).json()
    validate("CreateChatCompletionResponse", raw)


def test_chat_stream_shape_and_equality_with_non_streaming(server, client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=40, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_the_role_chunk_goes_out_with_the_first_token(server):
    """Harnesses time the first chunk, the role chunk: it must come with the first token, not when
    the prefill starts (before: at 5% of the time to the first token for a 600-token prompt)."""
    words = " ".join(f"w{uuid.uuid4().hex[:6]}" for _ in range(200))  # fresh: no cached prefix
    body = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 2, "stream": True,
            "ignore_eos": True}
    started = time.perf_counter()
    arrivals = []
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append((time.perf_counter(), json.loads(line[6:])))
    role_at, first = arrivals[0]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    token_at = next(t for t, chunk in arrivals[1:] if chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
    assert token_at - role_at < 0.25 * (token_at - started), (role_at - started, token_at - started)


def test_chat_stream_raw_frames_match_spec(server):
    # ignore_eos (vLLM's): a sampled answer may end before 10 tokens, and the count is checked below.
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 10, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in sse_events(r) if not e.startswith(":")]
    assert events[-1] == "[DONE]"
    for payload in events[:-1]:
        validate("CreateChatCompletionStreamResponse", json.loads(payload))
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 10


def test_seed_reproduces_sampling(client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=24, temperature=1.0, top_p=0.95, seed=1234)
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    second = client.chat.completions.create(**kwargs).choices[0].message.content
    other = [client.chat.completions.create(**{**kwargs, "seed": s}).choices[0].message.content for s in (1, 2)]
    assert first == second
    assert any(o != first for o in other)


def test_top_k_one_is_greedy(client):
    """Both requests alone in their steps with the same prefix-cache hit: in bfloat16 (--dtype auto
    on a CPU with native bf16) a prompt computed from cached blocks rounds differently from a cold
    one, which can flip a near-tie, so the cold first request is not the one compared."""
    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, temperature=0)  # caches the prompt
    greedy = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=20, temperature=0)
    top1 = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=20, temperature=1.5,
                                          extra_body={"top_k": 1})
    assert top1.choices[0].message.content == greedy.choices[0].message.content


def test_max_tokens_length_and_ignore_eos(client):
    resp = client.chat.completions.create(model=MODEL, messages=HELLO, max_completion_tokens=50,
                                          temperature=0, extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 50


def test_min_tokens_holds_back_eos(client):
    short = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=60, temperature=0)
    n = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop" and n < 50
    longer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                            max_tokens=60, temperature=0, extra_body={"min_tokens": n + 5})
    assert longer.usage.completion_tokens >= n + 5


def test_stop_string_never_reaches_the_client(client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=40, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 4]  # likely spans a token boundary
    cut = full[: full.index(stop)]
    resp = client.chat.completions.create(**kwargs, stop=[stop, "never-seen-xyz"])
    assert resp.choices[0].message.content == cut
    assert resp.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(**kwargs, stop=stop, stream=True) if c.choices)
    assert streamed == cut


# ---- completions ----------------------------------------------------------------------


def test_completions_prompt_forms(server, client, tokenizer):
    text = "The capital of France is"
    ids = tokenizer.encode(text).ids
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text
    batch = client.completions.create(model=MODEL, prompt=[text, "Once upon a time"], max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text
    id_batch = client.completions.create(model=MODEL, prompt=[ids, ids[:3]], max_tokens=8, temperature=0)
    assert id_batch.choices[0].text == by_text.choices[0].text
    assert 2 <= batch.usage.completion_tokens <= 16
    assert batch.usage.prompt_tokens == len(ids) + len(tokenizer.encode("Once upon a time").ids)
    validate("CreateCompletionResponse", post(server, "/v1/completions",
                                              {"model": MODEL, "prompt": text, "max_tokens": 4}).json())


def test_completions_stream_interleaves_choices(server, client):
    prompts = ["The capital of France is", "Once upon a time"]
    kwargs = dict(model=MODEL, prompt=prompts, max_tokens=12, temperature=0)
    full = client.completions.create(**kwargs)
    texts = ["", ""]
    # Streamed completion chunks carry finish_reason null until a choice ends (as OpenAI's do),
    # which the SDK's strict Completion type rejects: stream with a lenient client here.
    lenient = client.with_options()
    lenient._strict_response_validation = False
    for chunk in lenient.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in full.choices]
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json={**kwargs, "stream": True}) as r:
        events = [e for e in sse_events(r) if not e.startswith(":")]
    assert events[-1] == "[DONE]"
    for payload in events[:-1]:
        chunk = json.loads(payload)
        # The spec reuses the non-streamed schema for chunks, whose finish_reason is not nullable;
        # OpenAI itself streams null until a choice ends. Check everything else as-is.
        for c in chunk["choices"]:
            assert c.pop("finish_reason") in (None, "stop", "length")
            c["finish_reason"] = "length"
        validate("CreateCompletionResponse", chunk)


# ---- continuous batching --------------------------------------------------------------


def test_concurrent_requests_share_the_batch(aclient_factory):
    """8 concurrent requests finish in well under 8x the time of one (measured in this run)."""
    import time

    async def one(client, i):
        await client.completions.create(model=MODEL, prompt=f"Count to ten, number {i}:", max_tokens=48,
                                        temperature=0, extra_body={"ignore_eos": True})

    async def run(n):
        client = aclient_factory()
        await one(client, 99)  # warm
        started = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(n)))
        elapsed = time.perf_counter() - started
        await client.close()
        return elapsed

    single = asyncio.run(run(1))
    eight = asyncio.run(run(8))
    print(f"1 request: {single:.2f} s, 8 concurrent: {eight:.2f} s, ratio {eight / single:.2f}")
    assert eight < 4 * single


# ---- penalties --------------------------------------------------------------------------


def test_penalties_break_a_greedy_repetition(client, tokenizer):
    prompt = "1, 1, 1, 1, 1, 1, 1, 1, 1, 1,"
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    plain = client.completions.create(**kwargs).choices[0].text

    def num_repeats(text: str) -> int:  # how often the completion's most common token occurs
        ids = tokenizer.encode(text).ids
        return max(ids.count(t) for t in set(ids))

    assert num_repeats(plain) >= 5, plain  # greedy keeps counting ones
    for penalty in ({"frequency_penalty": 2.0}, {"extra_body": {"repetition_penalty": 2.0}}):
        text = client.completions.create(**kwargs, **penalty).choices[0].text
        assert text != plain and num_repeats(text) < num_repeats(plain), (penalty, text)
    # A penalty of 0 (and 1 for repetition) is no penalty: the same greedy tokens.
    same = client.completions.create(**kwargs, frequency_penalty=0, presence_penalty=0,
                                     extra_body={"repetition_penalty": 1.0, "min_p": 0.0})
    assert same.choices[0].text == plain


def test_penalty_out_of_range_names_the_parameter(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, presence_penalty=3)
    assert err.value.status_code == 400 and err.value.body["param"] == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, extra_body={"min_p": 1.5})
    assert err.value.body["param"] == "min_p"


def test_the_stop_token_text_is_left_out_as_vllm_does(client):
    """The eos that ends a choice is not text, even with skip_special_tokens false, unless
    include_stop_str_in_output (vLLM's rule for eos and stop_token_ids alike)."""
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=64, temperature=0)
    # Each computed from scratch (a salt of its own): a prompt read from the prefix cache can round otherwise in
    # bfloat16, and the greedy answer's first token flipped ("Hello there! I'm here..." / "I'm here...").
    fresh = lambda: {"cache_salt": uuid.uuid4().hex}  # noqa: E731
    plain = client.chat.completions.create(**kwargs, extra_body=fresh()).choices[0]
    assert plain.finish_reason == "stop"  # ended by eos <|im_end|>
    shown = client.chat.completions.create(**kwargs, extra_body={**fresh(), "skip_special_tokens": False}).choices[0]
    assert shown.message.content == plain.message.content and "<|im_end|>" not in shown.message.content
    kept = client.chat.completions.create(**kwargs, extra_body={**fresh(), "skip_special_tokens": False,
                                                                "include_stop_str_in_output": True})
    assert kept.choices[0].message.content == plain.message.content + "<|im_end|>"
