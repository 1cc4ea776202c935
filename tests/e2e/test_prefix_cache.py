"""Prefix caching end to end: a real `rill serve`, the openai SDK, usage.prompt_tokens_details."""
from __future__ import annotations

import uuid

import pytest

from tests.helpers.server import start_server, stats, stop_server

MODEL = "smollm2-135m-instruct"
BLOCK_SIZE = 16  # rill serve's default --block-size


def long_system_prompt() -> str:
    """About 700 tokens, opened by a fresh nonce: no earlier request of the session shares it."""
    rules = " ".join(
        f"Rule {i}: when a traveller asks about harbour number {i}, answer with its tide table, its "
        f"pilot's name and the colour of its lamp." for i in range(1, 28)
    )
    return f"Session {uuid.uuid4().hex}. You are the harbour master's assistant. {rules}"


def chat(client, system: str, user: str, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=24, temperature=0, **kw,
    )


def cached_tokens(resp) -> int:
    return resp.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def uncached_client(model_dir, tmp_path_factory):
    from openai import OpenAI

    srv = start_server(tmp_path_factory, "--max-model-len", "2048", "--no-enable-prefix-caching")
    yield OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", _strict_response_validation=True,
                 max_retries=0, timeout=120)
    stop_server(srv)


def test_a_shared_system_prompt_is_found_in_the_cache(server, client):
    system = long_system_prompt()
    before = stats(server)
    first = chat(client, system, "Which harbour has the red lamp?")
    assert first.usage.prompt_tokens > 600
    assert cached_tokens(first) == 0

    second = chat(client, system, "Who pilots harbour 7?")
    num_cached = cached_tokens(second)
    assert num_cached > 0 and num_cached % BLOCK_SIZE == 0
    assert num_cached >= 600 // BLOCK_SIZE * BLOCK_SIZE - BLOCK_SIZE  # the system prompt, less its last block
    assert num_cached < second.usage.prompt_tokens

    # The same request again: served on top of cached blocks, the same greedy text as the next
    # repeat. Not compared with the cold first request: in bfloat16 (--dtype auto on a CPU with
    # native bf16) a prompt computed on top of cached blocks rounds differently from a cold one,
    # which can flip a near-tie (a clean-clone CI run hit it).
    again = chat(client, system, "Which harbour has the red lamp?")
    assert cached_tokens(again) == (again.usage.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    repeat = chat(client, system, "Which harbour has the red lamp?")
    assert cached_tokens(repeat) == cached_tokens(again)
    assert again.choices[0].message.content == repeat.choices[0].message.content

    warm = chat(client, system, "Who pilots harbour 7?")  # now cached as far as the stream will be
    streamed = chat(client, system, "Who pilots harbour 7?", stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert cached_tokens(chunks[-1]) >= num_cached and cached_tokens(chunks[-1]) == cached_tokens(warm)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == warm.choices[0].message.content

    after = stats(server)
    num_hit_tokens = after["num_prefix_hit_tokens"] - before["num_prefix_hit_tokens"]
    num_query_tokens = after["num_prefix_queries_tokens"] - before["num_prefix_queries_tokens"]
    assert num_hit_tokens >= num_cached + cached_tokens(again)
    assert num_query_tokens >= first.usage.prompt_tokens + second.usage.prompt_tokens


def test_no_enable_prefix_caching_finds_nothing_and_generates_the_same(server, client, uncached_client):
    system = long_system_prompt()
    chat(client, system, "Which harbour has the red lamp?")
    hit = chat(client, system, "Who pilots harbour 7?")
    assert cached_tokens(hit) > 0
    misses = [chat(uncached_client, system, "Who pilots harbour 7?") for _ in range(2)]
    assert [cached_tokens(m) for m in misses] == [0, 0]
    assert misses[0].choices[0].message.content == misses[1].choices[0].message.content
    if stats(server)["dtype"] == "float32":  # in bfloat16 cached and cold prompts round differently
        assert misses[0].choices[0].message.content == hit.choices[0].message.content
