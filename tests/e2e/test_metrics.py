"""GET /metrics on a real `rill serve --workers 2`: counts equal what the clients saw, whichever
worker served a request and whichever worker answers the scrape."""
from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from rill.ipc.channels import run_dirs_of
from tests.helpers.server import start_server, stop_server

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    server = start_server(tmp_path_factory, "--workers", "2", "--max-model-len", "512")
    yield server
    stop_server(server)


def wait_for(predicate, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def scrape(server) -> dict[tuple, float]:
    """{(sample name, labels without model_name): value}; a fresh connection, so any worker answers."""
    r = httpx.get(f"{server.base_url}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def parse(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert s.labels.get("model_name") == MODEL, s
            out[s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))] = s.value
    return out


def diff(after: dict, before: dict) -> dict:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def counter(name: str, **labels) -> tuple:
    return f"rill:{name}", tuple(sorted(labels.items()))


def count(name: str) -> tuple:
    return f"rill:{name}_count", ()


def sdk(server) -> openai.OpenAI:
    """A client of its own (its own connection), so the requests spread over the workers. Not strict:
    streamed completions chunks carry `finish_reason: null` (README, the deliberate divergence)."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def run_known_requests(server) -> list[tuple[object, str]]:
    """Chat and completions, streamed and not, and one 400; returns (usage, finish_reason) of each."""
    chat = [{"role": "user", "content": "Name a colour."}]
    seen = [(r.usage, r.choices[0].finish_reason) for r in (
        sdk(server).chat.completions.create(model=MODEL, messages=chat, max_tokens=6, temperature=0),
        sdk(server).completions.create(model=MODEL, prompt="One, two,", max_tokens=4, extra_body={"ignore_eos": True}),
    )]
    for create, kwargs in ((sdk(server).chat.completions.create, {"messages": chat, "max_tokens": 5}),
                           (sdk(server).completions.create, {"prompt": "The sky is", "max_tokens": 3})):
        usage = finish = None
        for chunk in create(model=MODEL, stream=True, stream_options={"include_usage": True}, **kwargs):
            usage = chunk.usage or usage
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        seen.append((usage, finish))
    with pytest.raises(openai.BadRequestError):
        sdk(server).completions.create(model=MODEL, prompt="x", max_tokens=-1)
    return seen


def test_counts_match_what_the_clients_saw(srv):
    before = scrape(srv)
    seen = run_known_requests(srv)
    after = scrape(srv)
    got = diff(after, before)
    prompt = sum(u.prompt_tokens for u, _ in seen)
    output = [u.completion_tokens for u, _ in seen]
    assert got[counter("prompt_tokens_total")] == prompt
    assert got[counter("generation_tokens_total")] == sum(output)
    for reason in ("stop", "length"):
        expected = sum(f == reason for _, f in seen)
        assert got[counter("request_success_total", finished_reason=reason)] == expected, reason
    assert got[counter("request_success_total", finished_reason="abort")] == 0
    assert got[counter("http_responses_total", status="200")] == 4  # scrapes are not counted
    assert got[counter("http_responses_total", status="400")] == 1
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds", "request_prompt_tokens"):
        assert got[count(name)] == 4, name  # the 400 never reached the engine
    assert got[count("inter_token_latency_seconds")] == sum(n - 1 for n in output)  # per token
    assert got[count("request_time_per_output_token_seconds")] == sum(n > 1 for n in output)
    assert got[("rill:request_generation_tokens_sum", ())] == sum(output)
    e2e, ttft = got[("rill:e2e_request_latency_seconds_sum", ())], got[("rill:time_to_first_token_seconds_sum", ())]
    assert 0 < ttft < e2e
    # The engine's own figures: prefix-cache lookups are the prompts' tokens, hits the cached ones.
    assert got[counter("prefix_cache_queries_total", engine="0")] == prompt
    assert got[counter("prefix_cache_hits_total", engine="0")] == sum(u.prompt_tokens_details.cached_tokens for u, _ in seen)
    idle = wait_for(lambda: (s := scrape(srv))[counter("num_requests_running", engine="0")] == 0 and s)
    assert idle[counter("num_requests_waiting", engine="0")] == 0 and idle[counter("kv_cache_usage_perc", engine="0")] == 0
    assert idle[counter("num_preemptions_total", engine="0")] == 0


def test_every_worker_counts_and_any_worker_answers(srv):
    """Requests spread over both workers (fresh connections); each scrape sums them all."""
    before = scrape(srv)[counter("http_responses_total", status="200")]
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: httpx.get(f"{srv.base_url}/health", timeout=30).status_code, range(32)))
    assert codes == [200] * 32
    totals = {scrape(srv)[counter("http_responses_total", status="200")] for _ in range(8)}
    assert totals == {before + 32}
    # Each worker's own file: both served some, and the scrape is their sum.
    per_worker = worker_counts(run_dirs_of(srv.proc.pid)[0] / "metrics", "rill:http_responses_total")
    assert len(per_worker) == 2 and all(per_worker.values()), per_worker
    assert sum(per_worker.values()) == before + 32


def worker_counts(metrics_dir: Path, sample: str) -> dict[str, float]:
    """The 200s each worker process counted, read from its own counter file."""
    out = {}
    for db in metrics_dir.glob("counter_*.db"):
        one = metrics_dir.parent / f"one-{db.stem}"
        one.mkdir()
        try:
            shutil.copy(db, one / db.name)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(one))
            out[db.stem] = sum(s.value for f in registry.collect() for s in f.samples
                               if s.name == sample and s.labels.get("status") == "200")
        finally:
            shutil.rmtree(one)
    return out


def test_a_disconnect_mid_stream_is_counted_as_aborted(srv):
    before = scrape(srv)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True}
    received = 0
    with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            received += line.startswith("data: {")
            if received == 2:
                break  # leaving the block closes the connection mid-stream
    got = wait_for(lambda: (d := diff(scrape(srv), before))[counter("requests_disconnected_total")] and d)
    assert got[counter("requests_disconnected_total")] == 1
    assert got[counter("requests_aborted_total")] == 1
    assert got[counter("request_success_total", finished_reason="abort")] == 1
    assert got[counter("http_responses_total", status="200")] == 1  # its headers went out
    assert got[count("e2e_request_latency_seconds")] == 1
    assert got[count("request_decode_time_seconds")] == 0  # the engine never finished it
    assert 2 <= got[counter("generation_tokens_total")] < 300
    idle = wait_for(lambda: (s := scrape(srv))[counter("num_requests_running", engine="0")] == 0 and s)
    assert idle[counter("kv_cache_usage_perc", engine="0")] == 0
