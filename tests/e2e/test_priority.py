"""End to end: `rill serve --scheduling-policy priority` with one seat (--max-num-seqs 1), so that the order is the
scheduler's alone: an urgent request preempts the running bulk one and goes before the queued bulk ones, every
request still gets all its tokens, and /metrics counts the queue by priority. Under fcfs (the tiny hardening
server) a non-zero `priority` is a 400 naming it on every route that takes one."""
from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.openapi import validate
from tests.helpers.server import TINY_MODEL, sdk_client, start_server, stop_server

BULK_TOKENS = 600
# The running bulk request's length: the urgent request must reach the engine while it still runs. On a loaded
# 2-core CI machine the three bulk requests' arrival and the queue's polling once took longer than 600 tokens.
RUNNING_TOKENS = 2000
POLL_S = 0.05
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def prio(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--max-model-len", "2048", "--max-num-seqs", "1", "--scheduling-policy", "priority",
                       "--num-threads", "1")  # one engine thread: this test's polling then slows it little
    # The first steps build the kernels on a cold cache (a minute on CI), with the engine's figures still
    # unpublished: warm it before a test reads the queue.
    complete(srv.base_url, 0, 4, {}, "warm-up")
    yield srv
    stop_server(srv)


def complete(url: str, priority: int, max_tokens: int, done: dict, name: str) -> None:
    r = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "model": TINY_MODEL, "prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0, "priority": priority})
    assert r.status_code == 200, r.text
    done[name] = (time.monotonic(), r.json()["usage"]["completion_tokens"])


def waiting_by_priority(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {s.labels["priority"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "rill:num_requests_waiting_by_priority"}


def by_priority(url: str) -> dict[str, list[int]]:
    return httpx.get(f"{url}/stats", timeout=30).json()["by_priority"]  # {priority: [running, waiting]}


def test_urgent_work_preempts_and_overtakes_bulk_work(prio):
    url = prio.base_url
    done: dict = {}
    preemptions = httpx.get(f"{url}/stats", timeout=30).json()["num_preemptions"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        deadline = time.monotonic() + 60
        running = pool.submit(complete, url, 5, RUNNING_TOKENS, done, "bulk0")
        while by_priority(url).get("5", [0, 0])[0] < 1 and time.monotonic() < deadline:
            time.sleep(POLL_S)  # bulk0 holds the one seat
        queued = [pool.submit(complete, url, 5, BULK_TOKENS, done, f"bulk{i}") for i in (1, 2)]
        while waiting_by_priority(url).get("5", 0) < 2 and time.monotonic() < deadline:
            time.sleep(POLL_S)  # and two wait behind it
        assert waiting_by_priority(url)["5"] == 2
        assert "bulk0" not in done, "the running request ended before urgent work could be sent"
        urgent = pool.submit(complete, url, -1, 8, done, "urgent")
        for future in [urgent, running, *queued]:
            future.result()
    assert done["bulk0"][1] == RUNNING_TOKENS
    assert all(done[name][1] == BULK_TOKENS for name in ("bulk1", "bulk2"))
    finished_at = {name: at for name, (at, _) in done.items()}
    assert sorted(finished_at, key=finished_at.get)[0] == "urgent"  # before the running one, which gave way
    assert httpx.get(f"{url}/stats", timeout=30).json()["num_preemptions"] > preemptions


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 2, "store": False}),
])
def test_fcfs_refuses_a_priority_naming_it(tiny_server, path, body):
    url = f"{tiny_server.base_url}{path}"
    r = httpx.post(url, json={"model": TINY_MODEL, **body, "priority": 3}, timeout=60)
    assert r.status_code == 400, r.text
    validate("ErrorResponse", r.json())
    assert r.json()["error"]["param"] == "priority"
    assert httpx.post(url, json={"model": TINY_MODEL, **body, "priority": 0}, timeout=60).status_code == 200
    too_big = httpx.post(url, json={"model": TINY_MODEL, **body, "priority": 1 << 40}, timeout=60)
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "priority"


def test_messages_takes_priority_too(tiny_server):
    """Anthropic's API has no such field: it is vLLM's extension here too, answered in Anthropic's error shape."""
    url = f"{tiny_server.base_url}/v1/messages"
    body = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    r = httpx.post(url, json={**body, "priority": 3}, timeout=60)
    assert r.status_code == 400 and r.json()["type"] == "error" and "`priority`" in r.json()["error"]["message"], r.text
    assert httpx.post(url, json={**body, "priority": 0}, timeout=60).status_code == 200


def test_priority_on_embeddings_under_fcfs_is_a_400(server):
    r = httpx.post(f"{server.base_url}/v1/embeddings", timeout=60,
                   json={"model": "smollm2-135m-instruct", "input": "Hi", "priority": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text




def test_batch_lines_run_behind_interactive_work(prio):
    """Under the priority policy the Batch API's lines run at BATCH_PRIORITY (asgi/batch/line_call.py)."""
    from rill.asgi.batch.line_call import BATCH_PRIORITY

    client = sdk_client(prio)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
            "body": {"model": TINY_MODEL, "prompt": [5, 6], "max_tokens": BULK_TOKENS, "ignore_eos": True}}
    upload = client.files.create(file=("lines.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (batch := client.batches.retrieve(batch.id)).status not in FINAL:
        seen |= set(httpx.get(f"{prio.base_url}/stats", timeout=30).json()["by_priority"])
        time.sleep(0.05)
    assert batch.status == "completed" and batch.request_counts.completed == 1
    assert str(BATCH_PRIORITY) in seen
