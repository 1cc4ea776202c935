"""The state store across API workers, restarts and servers: SQLite (default and durable) and
Redis (a real redis-server), and a store that is broken or down."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.helpers.redis_server import free_port
from tests.helpers.responses_events import check_stream, parse_sse
from tests.helpers.server import start_server, start_servers, stop_server

MODEL = "smollm2-135m-instruct"
FINISHED = ("completed", "incomplete")  # the model's own end, or max_output_tokens (3 here)
TTL_S = 12  # --responses-store-ttl of two_workers
SECRET = "Zanzibar-7731"  # stored content that must never appear in a log


def create(srv, **body) -> dict:
    r = httpx.post(f"{srv.base_url}/v1/responses", json={"model": MODEL, "max_output_tokens": 3, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def get(srv, path: str) -> httpx.Response:
    return httpx.get(f"{srv.base_url}{path}", timeout=30)  # a new connection each time: any worker may answer


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", _strict_response_validation=True)


def alone_tokens(srv, text: str) -> int:
    r = httpx.post(f"{srv.base_url}/v1/responses/input_tokens", json={"model": MODEL, "input": text}, timeout=30)
    return r.json()["input_tokens"]


@pytest.fixture(scope="module")
def two_workers(model_dir, tmp_path_factory):
    srv = start_server(tmp_path_factory, "--workers", "2", "--responses-store-ttl", str(TTL_S))
    # The TTL's clock starts here and test_ttl_holds_on_every_worker, last in this file, reads it:
    # the other tests' servers fill the wait that a sleep of the whole TTL (12.5 s) used to.
    response_id = create(srv, input="Soon gone.")["id"]
    assert get(srv, f"/v1/responses/{response_id}").status_code == 200
    srv.expiring = (response_id, time.monotonic())
    yield srv
    stop_server(srv)


def test_every_worker_finds_every_response(two_workers):
    srv = two_workers
    ids = [create(srv, input=f"Say {i}.")["id"] for i in range(6)]
    for _ in range(4):
        for response_id in ids:
            r = get(srv, f"/v1/responses/{response_id}")
            assert r.status_code == 200 and r.json()["status"] in FINISHED, r.text
            assert get(srv, f"/v1/responses/{response_id}/input_items").json()["data"][0]["type"] == "message"
    # A chain of three turns, each on whatever worker takes it.
    sdk = client(srv)
    first = sdk.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=3)
    second = sdk.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                  max_output_tokens=3)
    third = sdk.responses.create(model=MODEL, input="Again?", previous_response_id=second.id, max_output_tokens=3)
    assert third.usage.input_tokens > second.usage.input_tokens > alone_tokens(srv, "What is my name?")
    conv = sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "I like tea."}])
    turn = sdk.responses.create(model=MODEL, input="What do I like?", conversation=conv.id, max_output_tokens=3)
    for _ in range(4):
        items = get(srv, f"/v1/conversations/{conv.id}/items?order=asc").json()["data"]
        assert [i["type"] for i in items] == ["message", "message", "message"]
        assert items[-1]["id"] == turn.output[-1].id


def test_cancel_from_any_worker(two_workers):
    """A cancel on the worker that runs the response is direct; on the other it goes through the
    engine. Three tries make both likely; each must end the same way."""
    for _ in range(3):
        answers, threads = [], []

        def cancel(response_id):
            time.sleep(0.3)
            answers.append(httpx.post(f"{two_workers.base_url}/v1/responses/{response_id}/cancel", timeout=30))

        lines = []
        body = {"model": MODEL, "input": "Count to a thousand.", "max_output_tokens": 1500, "temperature": 0,
                "stream": True}
        with httpx.stream("POST", f"{two_workers.base_url}/v1/responses", json=body, timeout=120) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: ") and '"response.created"' in line:
                    threads.append(threading.Thread(target=cancel, args=(json.loads(line[6:])["response"]["id"],)))
                    threads[-1].start()
        for thread in threads:
            thread.join()
        response = check_stream(parse_sse(lines))
        assert answers[0].status_code == 200, answers[0].text
        assert response["status"] == "cancelled" and response["usage"]["output_tokens"] < 1500
        assert get(two_workers, f"/v1/responses/{response['id']}").json()["status"] == "cancelled"


def test_durable_sqlite_survives_restarts_and_a_killed_server(model_dir, tmp_path_factory):
    db = tmp_path_factory.mktemp("state") / "state.db"
    url = f"sqlite://{db}"
    srv = start_server(tmp_path_factory, "--state-store", url, "--log-level", "info")
    sdk = client(srv)
    first = sdk.responses.create(model=MODEL, input=f"My name is Ada. {SECRET}", max_output_tokens=3)
    gone = sdk.responses.create(model=MODEL, input="Forget this.", max_output_tokens=3)
    sdk.responses.delete(gone.id)
    conv = sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "I like tea."}],
                                    metadata={"topic": "drinks"})
    sdk.responses.create(model=MODEL, input="What do I like?", conversation=conv.id, max_output_tokens=3)
    stop_server(srv)
    assert "rill.access" in srv.log() and SECRET not in srv.log()  # stored content never reaches the logs

    srv = start_server(tmp_path_factory, "--state-store", url, "--workers", "2")
    sdk = client(srv)
    assert sdk.responses.retrieve(first.id).status in FINISHED
    assert get(srv, f"/v1/responses/{gone.id}").status_code == 404
    assert sdk.conversations.retrieve(conv.id).metadata == {"topic": "drinks"}
    assert len(get(srv, f"/v1/conversations/{conv.id}/items").json()["data"]) == 3
    chained = sdk.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                   max_output_tokens=3)
    assert chained.usage.input_tokens > alone_tokens(srv, "What is my name?")
    # Acknowledged, then every process of the server killed at once: nothing acknowledged is lost.
    acknowledged = [create(srv, input=f"Keep {i}.")["id"] for i in range(5)]
    os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(30)

    srv = start_server(tmp_path_factory, "--state-store", url)
    for response_id in [*acknowledged, chained.id]:
        assert get(srv, f"/v1/responses/{response_id}").json()["status"] in FINISHED
    stop_server(srv)
    assert db.exists()  # a durable store outlives its server


def test_two_servers_share_one_redis(model_dir, tmp_path_factory, redis_server):
    a, b = start_servers(tmp_path_factory, ("--state-store", redis_server.url),
                         ("--state-store", redis_server.url, "--workers", "2"))
    try:
        made_on_a = client(a).responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=3)
        assert client(b).responses.retrieve(made_on_a.id).status in FINISHED
        chained = client(b).responses.create(model=MODEL, input="What is my name?", previous_response_id=made_on_a.id,
                                             max_output_tokens=3)
        assert chained.usage.input_tokens > alone_tokens(b, "What is my name?")
        conv = client(b).conversations.create(items=[{"type": "message", "role": "user", "content": "Hi."}])
        client(a).conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "Yo."}])
        assert len(get(b, f"/v1/conversations/{conv.id}/items").json()["data"]) == 2
        client(a).responses.delete(chained.id)
        assert get(b, f"/v1/responses/{chained.id}").status_code == 404
        assert redis_server.command("EXISTS", f"rill:resp:{chained.id}") == b":0\r\n"  # the key itself is gone
        # A background stream left on A resumes on B, which follows it through Redis while A runs it.
        first = []
        with client(a).responses.create(model=MODEL, input="Count to a hundred.", max_output_tokens=60,
                                        temperature=0, background=True, stream=True) as stream:
            for event in stream:
                first.append(event)
                if len(first) == 6:
                    break
        rest = list(client(b).responses.retrieve(first[0].response.id, stream=True, starting_after=5))
        events = first + rest
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].response.output_text == \
            "".join(e.delta for e in events if e.type == "response.output_text.delta")
        client(b).responses.delete(events[0].response.id)
        assert redis_server.command("EXISTS", f"rill:resp-events:{events[0].response.id}") == b":0\r\n"
    finally:
        stop_server(a)
        stop_server(b)


@pytest.mark.parametrize("store", ["corrupt-sqlite", "redis-down"])
def test_a_broken_store_fails_only_its_routes(model_dir, tmp_path_factory, store):
    if store == "corrupt-sqlite":
        db = tmp_path_factory.mktemp("broken") / "state.db"
        db.write_bytes(b"not a database at all " * 500)
        url = f"sqlite://{db}"
    else:
        url = f"redis://127.0.0.1:{free_port()}/0"
    srv = start_server(tmp_path_factory, "--state-store", url, "--log-level", "info")
    try:
        for method, path, body in [("POST", "/v1/responses", {"model": MODEL, "input": SECRET, "max_output_tokens": 2}),
                                   ("GET", "/v1/responses/resp_1", None), ("POST", "/v1/conversations", {}),
                                   ("GET", "/v1/conversations/conv_1/items", None)]:
            r = httpx.request(method, f"{srv.base_url}{path}", json=body, timeout=60)
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["code"] == "store_unavailable" and "state store" in r.json()["error"]["message"]
        unstored = create(srv, input="hi", store=False)  # needs no store
        assert unstored["status"] in FINISHED
        chat = client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=2)
        assert chat.choices[0].finish_reason == "length"
    finally:
        stop_server(srv)
    assert "Traceback" not in srv.log()
    assert "state store" in srv.log() and SECRET not in srv.log()  # the failure is logged, never the content


def test_ttl_holds_on_every_worker(two_workers):
    response_id, created_at = two_workers.expiring  # created, and found, when the server started
    time.sleep(max(0.0, created_at + TTL_S + 0.5 - time.monotonic()))
    for _ in range(4):
        assert get(two_workers, f"/v1/responses/{response_id}").status_code == 404
