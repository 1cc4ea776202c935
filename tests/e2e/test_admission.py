"""Admission control end to end: queue bounds give 429 at once, across workers; --request-timeout.

Two servers: one with two API workers, one seat (--max-num-seqs 1) and both queue bounds; one
with --request-timeout. Clients are the OpenAI SDK (strict, max_retries=0: it retries 429s by
default) or httpx where the raw bytes matter.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time

import httpx
import openai
import pytest

from tests.helpers.openapi import validate
from tests.helpers.server import start_servers, stats, stop_server

MODEL = "smollm2-135m-instruct"
MAX_QUEUED_REQUESTS = 2
MAX_QUEUED_TOKENS = 2000
TIMEOUT_S = 3


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """`srv` and `timeout_srv`, started at once: their starts overlap."""
    both = start_servers(tmp_path_factory,
                         ("--workers", "2", "--max-num-seqs", "1", "--max-model-len", "2048",
                          "--max-queued-requests", str(MAX_QUEUED_REQUESTS), "--max-queued-tokens",
                          str(MAX_QUEUED_TOKENS), "--log-level", "info", "--log-format", "json"),
                         ("--max-num-seqs", "1", "--max-model-len", "2048",
                          "--request-timeout", str(TIMEOUT_S), "--sse-keepalive", "0.5"))
    yield both
    for server in both:
        stop_server(server)


@pytest.fixture(scope="module")
def srv(servers):
    return servers[0]


def sdk(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", _strict_response_validation=True,
                              max_retries=0, timeout=300)


def chat_args(content: str, max_tokens: int) -> dict:
    return dict(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
                temperature=0, extra_body={"ignore_eos": True})


async def drain(stream) -> tuple[int, float]:
    """Reads a chat stream to its end: (completion tokens from usage, time of the first content)."""
    usage, first_s = None, None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first_s is None:
            first_s = time.perf_counter()
        usage = chunk.usage or usage
    return usage.completion_tokens, first_s


async def wait_for(predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := await asyncio.to_thread(predicate):
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def check_429(exc: openai.RateLimitError, kind: str) -> int:
    """A spec-valid OpenAI rate-limit body with a whole-seconds Retry-After; returns that."""
    assert exc.status_code == 429
    body = exc.response.json()
    validate("ErrorResponse", body)
    assert body["error"]["type"] == kind and body["error"]["code"] == "rate_limit_exceeded"
    retry_after = exc.response.headers["retry-after"]
    assert re.fullmatch(r"[1-9]\d*", retry_after), retry_after
    return int(retry_after)


def engine_idle(server) -> dict | None:
    figures = stats(server)
    idle = figures["num_running"] == figures["num_waiting"] == 0
    return figures if idle and figures["num_free_blocks"] == figures["num_total_blocks"] else None


def test_past_the_queue_bound_a_request_gets_429_at_once(srv):
    """One seat, two queued: the fourth request is refused while the first one's long prefill
    step runs, without waiting for it; the three admitted ones finish in full."""
    # ~1,740 tokens, near --max-model-len and --max-queued-tokens: a prefill long enough (0.2 s at 720 tokens) that a slow, loaded machine's
    # answer to the refused request still lands well inside it.
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 190)

    async def run():
        client = sdk(srv)
        stream_args = dict(stream=True, stream_options={"include_usage": True})
        running = await client.chat.completions.create(**chat_args(long_prompt, 24), **stream_args)
        admitted_s = time.perf_counter()  # its headers: admitted; its prefill starts now
        first = asyncio.create_task(drain(running))
        # The SDK returns a stream once its headers came, and the headers wait for admission.
        queued = [await client.chat.completions.create(**chat_args(f"Queued {i}", 8), **stream_args)
                  for i in range(MAX_QUEUED_REQUESTS)]
        sent_s = time.perf_counter()
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(**chat_args("One too many", 8))
        refused_s = time.perf_counter()
        results = [await first, *[await drain(s) for s in queued]]
        await client.close()
        return admitted_s, sent_s, refused_s, refused.value, results

    admitted_s, sent_s, refused_s, exc, results = asyncio.run(run())
    check_429(exc, "requests")
    (first_tokens, first_content_s), *rest = results
    assert first_tokens == 24 and [n for n, _ in rest] == [8, 8]
    prefill_s = first_content_s - admitted_s
    # Refused well within the prefill step it arrived in: the input thread answered, not the loop.
    assert refused_s < first_content_s, "the 429 waited for the engine step"
    assert (refused_s - sent_s) / prefill_s < 0.4, (refused_s - sent_s, prefill_s)


def test_token_bound_and_prompt_lists(srv):
    """Prompt tokens waiting are bounded too, and a prompt list counts as its prompts."""

    def ids(n: int) -> list[int]:
        return [100 + i % 500 for i in range(n)]

    async def run():
        client = sdk(srv)
        await wait_for(lambda: engine_idle(srv))
        running = asyncio.create_task(client.completions.create(model=MODEL, prompt="Once", max_tokens=120,
                                                                extra_body={"ignore_eos": True}))
        await wait_for(lambda: stats(srv)["num_running"] == 1)
        big = asyncio.create_task(client.completions.create(model=MODEL, prompt=ids(1200), max_tokens=2,
                                                            extra_body={"ignore_eos": True}))
        await wait_for(lambda: stats(srv)["num_waiting_tokens"] == 1200)
        with pytest.raises(openai.RateLimitError) as too_many_tokens:  # 1,200 + 801 > 2,000
            await client.completions.create(model=MODEL, prompt=ids(801), max_tokens=2)
        with pytest.raises(openai.RateLimitError) as too_many_prompts:  # 1 + 2 > 2, though tokens fit
            await client.completions.create(model=MODEL, prompt=[ids(5), ids(5)], max_tokens=2)
        fits = await client.completions.create(model=MODEL, prompt=ids(800), max_tokens=3,
                                               extra_body={"ignore_eos": True})
        out = [await running, await big, fits]
        await client.close()
        return too_many_tokens.value, too_many_prompts.value, out

    before = stats(srv)["num_rejected"]
    too_many_tokens, too_many_prompts, (running, big, fits) = asyncio.run(run())
    check_429(too_many_tokens, "tokens")
    check_429(too_many_prompts, "requests")
    assert [r.usage.completion_tokens for r in (running, big, fits)] == [120, 2, 3]
    assert big.usage.prompt_tokens == 1200 and fits.usage.prompt_tokens == 800
    assert stats(srv)["num_rejected"] == before + 3  # engine requests: 1 + 2
    # A refused request never reached the engine: its metrics show only the 429 responses.
    metrics = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
    assert re.search(r'http_responses_total\{model_name="[^"]+",status="429"\} [1-9]', metrics)


def test_the_bound_holds_across_workers(srv):
    """A burst over fresh connections, spread over both API workers: exactly the queue's room
    is admitted overall, not that much per worker."""
    url = f"{srv.base_url}/v1/completions"
    burst = 8

    async def run(round_no: int):
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            await wait_for(lambda: engine_idle(srv))
            running = asyncio.create_task(client.post(url, json={"model": MODEL, "prompt": "Once", "max_tokens": 80,
                                                                 "ignore_eos": True}))
            await wait_for(lambda: stats(srv)["num_running"] == 1)
            tags = [f"burst-{round_no}-{i}" for i in range(burst)]
            replies = await asyncio.gather(*(client.post(
                url, json={"model": MODEL, "prompt": f"Burst {i}", "max_tokens": 2}, headers={"x-request-id": tag})
                for i, tag in enumerate(tags)))
            return tags, replies, await running

    for round_no in range(8):  # the workers race to accept each connection; retry until both served some
        tags, replies, running = asyncio.run(run(round_no))
        statuses = sorted(r.status_code for r in replies)
        assert running.status_code == 200
        assert statuses == [200] * MAX_QUEUED_REQUESTS + [429] * (burst - MAX_QUEUED_REQUESTS), statuses
        for r in replies:
            if r.status_code == 429:
                validate("ErrorResponse", r.json())
        pids = worker_pids(srv, tags)
        if len(set(pids.values())) == 2:
            break
    else:
        pytest.fail(f"every burst went to one worker: {pids}")
    admitted_by = {pids[r.headers["x-request-id"]] for r in replies if r.status_code == 200}
    refused_by = {pids[r.headers["x-request-id"]] for r in replies if r.status_code == 429}
    assert admitted_by | refused_by == set(pids.values())


def worker_pids(server, tags: list[str]) -> dict[str, int]:
    """The pid of the worker that served each tagged request, from the JSON access log (written
    just after each response went out)."""
    found: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while set(found) != set(tags) and time.monotonic() < deadline:
        time.sleep(0.05)
        for line in server.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"rill.access"' in line:
                record = json.loads(line)
                if record.get("request_id") in tags:
                    found[record["request_id"]] = record["pid"]
    assert set(found) == set(tags), "an access line is missing"
    return found


# ---- --request-timeout ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def timeout_srv(servers):
    return servers[1]


def test_request_timeout_ends_running_and_queued_requests(timeout_srv):
    """A running stream ends with a `request_timeout` error event and [DONE]; a queued stream too
    (the SDK raises); a queued plain request gets 504. The engine frees everything."""
    url = f"{timeout_srv.base_url}/v1/chat/completions"
    long = chat_args("Tell me a very long story.", 1500)
    body = {k: v for k, v in long.items() if k != "extra_body"} | long["extra_body"]

    async def raw_stream() -> list[str]:
        async with httpx.AsyncClient(timeout=300) as client:
            async with client.stream("POST", url, json={**body, "stream": True}) as r:
                assert r.status_code == 200
                return [line async for line in r.aiter_lines() if line.startswith("data:")]

    async def sdk_stream(client) -> Exception:
        stream = await client.chat.completions.create(**long, stream=True)
        with pytest.raises(openai.APIError) as failed:
            async for _ in stream:
                pass
        return failed.value

    async def run():
        client = sdk(timeout_srv)
        first = asyncio.create_task(raw_stream())
        await wait_for(lambda: stats(timeout_srv)["num_running"] == 1)
        queued = asyncio.create_task(sdk_stream(client))
        with pytest.raises(openai.APIStatusError) as plain:
            await client.chat.completions.create(**long)
        out = await first, await queued, plain.value
        await client.close()
        return out

    events, stream_error, plain = asyncio.run(run())
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: "):])
    validate("ErrorResponse", error)
    assert error["error"]["code"] == "request_timeout"
    assert 1 < len(events) - 2 < 1500, "the running stream sent tokens, then was cut short"
    assert isinstance(stream_error.body, dict) and stream_error.body["code"] == "request_timeout"
    assert plain.status_code == 504
    validate("ErrorResponse", plain.response.json())
    assert plain.response.json()["error"]["code"] == "request_timeout"
    figures = engine_idle(timeout_srv)
    assert figures is not None, stats(timeout_srv)
    assert figures["num_timed_out"] == 3 and figures["num_finished"] == 0
    # Each worker counts a request just after its response went out.
    asyncio.run(wait_for(lambda: timeout_count(timeout_srv) == 3, timeout_s=10))


def timeout_count(server) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    line = next((line for line in text.splitlines() if line.startswith("rill:request_success_total{")
                 and 'finished_reason="timeout"' in line), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def test_background_responses_have_a_bound_of_their_own(timeout_srv):
    """No connection holds a background response: a worker runs at most --max-num-seqs (1 here) at once, and past
    it the create is a 429 naming `background`, before anything is stored or queued."""
    url = f"{timeout_srv.base_url}/v1/responses"
    body = {"model": MODEL, "input": "Write a very long story about the sea.", "max_output_tokens": 1500,
            "temperature": 0, "background": True}
    first = httpx.post(url, json=body, timeout=60)
    assert first.status_code == 200 and first.json()["status"] == "in_progress", first.text
    second = httpx.post(url, json=body, timeout=60)
    assert second.status_code == 429 and second.json()["error"]["param"] == "background", second.text
    httpx.post(f"{url}/{first.json()['id']}/cancel", timeout=30)


def test_streams_of_a_stored_response_have_a_bound(timeout_srv):
    """GET ?stream=true holds a connection and polls the store: a worker serves at most 4 for each of --max-num-seqs
    (1 here) at once; past them a 429 naming `stream`, and the others go on to their end."""
    url = f"{timeout_srv.base_url}/v1/responses"
    body = {"model": MODEL, "input": "Write a very long story about the sea.", "max_output_tokens": 1500,
            "temperature": 0, "background": True, "stream": True}

    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(100):  # the background response of the test before may still be ending (a 429)
                async with client.stream("POST", url, json=body) as created:
                    if created.status_code == 200:
                        line = await anext(line async for line in created.aiter_lines() if line.startswith("data: "))
                        break
                await asyncio.sleep(0.1)
            response_id = json.loads(line[6:])["response"]["id"]
            readers, stacks = [], contextlib.AsyncExitStack()
            async with stacks:
                for _ in range(4):
                    r = await stacks.enter_async_context(client.stream("GET", f"{url}/{response_id}?stream=true"))
                    assert r.status_code == 200
                    readers.append(r)
                extra = await client.get(f"{url}/{response_id}?stream=true")
                assert extra.status_code == 429 and extra.json()["error"]["param"] == "stream", extra.text
                await client.post(f"{url}/{response_id}/cancel")
                ends = [[line async for line in r.aiter_lines() if line.startswith("event: ")][-1] for r in readers]
            assert ends == ["event: response.failed"] * 4  # cancelled
            again = await client.get(f"{url}/{response_id}?stream=true")  # the readers have left: room again
            assert again.status_code == 200 and "event: response.failed" in again.text
    asyncio.run(go())
