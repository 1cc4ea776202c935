"""The Batch API end to end: the OpenAI SDK (strict) uploads, creates, polls, downloads, cancels;
every output line matches the same request sent directly (greedy); a bad file fails validation
with OpenAI's `errors`; bad input is a 4xx naming its parameter; a server stopped in the middle
of a batch resumes it on start without redoing a line, and a batch past its deadline expires."""
from __future__ import annotations

import io
import json
import sqlite3
import time

import httpx
import openai
import pytest

from tests.helpers.openapi import validate
from tests.helpers.server import TINY_MODEL, sdk_client, start_server, stop_server

MODEL = TINY_MODEL
FINAL = ("completed", "failed", "expired", "cancelled")
NO_FILE, NO_BATCH = "file-" + "0" * 32, "batch_" + "0" * 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """bench's tiny random-weight model: each step costs almost nothing, greedy is still greedy."""
    from rill.bench.serving.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def tiny_flags(tiny, store) -> tuple[str, ...]:
    return ("--model", str(tiny), "--load-format", "dummy", "--served-model-name", MODEL, "--max-model-len", "1024",
            "--kv-cache-memory", "64MiB", "--state-store", f"sqlite://{store}")


@pytest.fixture(scope="module")
def srv(tiny, tmp_path_factory):
    store = tmp_path_factory.mktemp("batch-store") / "state.db"
    srv = start_server(tmp_path_factory, *tiny_flags(tiny, store), "--workers", "2", "--enable-embeddings",
                       "--batch-concurrency", "2", "--files-max-bytes", "64KiB", "--batch-max-lines", "20",
                       "--files-max-count", "40")
    yield srv
    stop_server(srv)


def line(custom_id: str, body: dict, url: str = "/v1/chat/completions", **extra) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, **body}, **extra}


LONG = 700  # tokens of a long line: about a second each on the tiny model, more on a loaded machine


def chat(i: int, max_tokens: int = 8) -> dict:
    """Long ones (a cancel, a restart in the middle) run to max_tokens: a few seconds for a batch."""
    return {"messages": [{"role": "user", "content": f"Name a fruit that starts with the letter {'ABCDEFGH'[i]}."}],
            "max_tokens": max_tokens, "temperature": 0, **({"ignore_eos": True} if max_tokens > 8 else {})}


def upload(client: openai.OpenAI, lines: list[dict]):
    data = "".join(json.dumps(obj) + "\n" for obj in lines).encode()
    return client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")


def wait(client: openai.OpenAI, batch_id: str, until=FINAL, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if (batch.status in until) if isinstance(until, tuple) else until(batch):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}: {batch}")


def records(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(raw) for raw in client.files.content(file_id).text.splitlines()]


def raw_get(srv, path: str) -> dict:
    r = httpx.get(f"{srv.base_url}{path}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_batch_matches_direct_requests(srv):
    client = sdk_client(srv)
    lines = [line(f"fruit-{i}", chat(i)) for i in range(5)]
    lines.append(line("no-messages", {"max_tokens": 4}))  # the route's 400: a line of the error file
    source = upload(client, lines)
    validate("OpenAIFile", raw_get(srv, f"/v1/files/{source.id}"))
    assert client.files.content(source.id).content == "".join(json.dumps(o) + "\n" for o in lines).encode()
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "fruits"})
    assert batch.status == "validating" and batch.request_counts.total == 6 and batch.model == MODEL
    batch = wait(client, batch.id)
    validate("Batch", raw_get(srv, f"/v1/batches/{batch.id}"))
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 1)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.metadata == {"job": "fruits"}
    assert batch.usage.output_tokens > 0
    output = {r["custom_id"]: r for r in records(client, batch.output_file_id)}
    assert sorted(output) == [f"fruit-{i}" for i in range(5)]
    for i in range(5):
        rec = output[f"fruit-{i}"]
        assert rec["id"].startswith("batch_req_") and rec["error"] is None
        assert rec["response"]["status_code"] == 200 and rec["response"]["request_id"]
        direct = client.chat.completions.create(model=MODEL, **chat(i))
        assert rec["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
    (error,) = records(client, batch.error_file_id)
    assert error["custom_id"] == "no-messages" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "messages"
    for file_id in (batch.output_file_id, batch.error_file_id):
        meta = raw_get(srv, f"/v1/files/{file_id}")
        validate("OpenAIFile", meta)
        assert meta["purpose"] == "batch_output"


def test_completions_embeddings_and_responses_batches(srv):
    client = sdk_client(srv)
    cases = [
        ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0},
         lambda b: b["choices"][0]["text"], lambda: client.completions.create(
             model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0).choices[0].text),
        ("/v1/embeddings", {"input": "a sentence to embed"}, lambda b: b["data"][0]["embedding"][:4],
         lambda: client.embeddings.create(model=MODEL, input="a sentence to embed", encoding_format="float").data[0].embedding[:4]),
        ("/v1/responses", {"input": "Say hello.", "max_output_tokens": 6, "temperature": 0, "store": False},
         lambda b: b["output"][0]["content"][0]["text"], lambda: client.responses.create(
             model=MODEL, input="Say hello.", max_output_tokens=6, temperature=0, store=False).output_text),
    ]
    started = []
    for url, body, _, _ in cases:
        source = upload(client, [line("only", body, url)])
        started.append(client.batches.create(input_file_id=source.id, endpoint=url, completion_window="24h"))
    for (url, _, read, direct), batch in zip(cases, started):
        batch = wait(client, batch.id)
        assert batch.status == "completed" and batch.request_counts.completed == 1, batch
        (rec,) = records(client, batch.output_file_id)
        got, want = read(rec["response"]["body"]), direct()
        if url == "/v1/embeddings":
            assert got == pytest.approx(want, abs=1e-4)
        else:
            assert got == want


def test_bad_file_fails_validation_with_errors(srv):
    client = sdk_client(srv)
    data = "\n".join([
        json.dumps(line("a", chat(0))),
        json.dumps(line("a", chat(1))),  # 2: duplicate custom_id
        json.dumps(line("c", chat(2), url="/v1/completions")),  # 3: another url
        "{not json",  # 4
        json.dumps(line("e", {**chat(3), "model": "other"})),  # 5: another model
        json.dumps({**line("f", chat(4)), "method": "GET"}),  # 6
        json.dumps(line("g", {**chat(5), "stream": True})),  # 7
    ]).encode()
    source = client.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at
    validate("Batch", raw_get(srv, f"/v1/batches/{batch.id}"))
    got = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert got == [(2, "duplicate_custom_id", "custom_id"), (3, "invalid_url", "url"), (4, "invalid_json_line", None),
                   (5, "mismatched_model", "body.model"), (6, "invalid_request", "method"),
                   (7, "invalid_request", "body.stream")]


def test_cancel_keeps_what_was_written(srv):
    client = sdk_client(srv)
    # The first line is short and the rest long: one is written at once, and the cancel comes long before the
    # others could all finish, however slow the machine (all of them took 1 s at 200 tokens: a loaded CI lost that race).
    lines = [line(f"long-{i}", chat(i % 8, 8 if i == 0 else LONG)) for i in range(12)]
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    wait(client, batch.id, lambda b: b.status == "in_progress" and b.request_counts.completed >= 1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at, batch
    counts = batch.request_counts
    assert 1 <= counts.completed < 12 and counts.failed == 0
    output = records(client, batch.output_file_id)
    assert len(output) == counts.completed == len({r["custom_id"] for r in output})
    assert all(r["response"]["status_code"] == 200 for r in output)
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: unchanged
    r = httpx.post(f"{srv.base_url}/v1/batches/{batch.id}/cancel", timeout=30)
    assert r.status_code == 200


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    validate("ErrorResponse", r.json())
    return r.json()["error"]


def test_bad_requests_name_their_parameter(srv):
    base = srv.base_url
    post_file = lambda files, data=None: httpx.post(f"{base}/v1/files", files=files, data=data, timeout=30)  # noqa: E731
    ok_line = (json.dumps(line("x", chat(0))) + "\n").encode()
    assert error_of(httpx.post(f"{base}/v1/files", json={"purpose": "batch"}), 415)["code"] == "unsupported_media_type"
    assert error_of(post_file({"file": ("a.jsonl", ok_line)}), 400)["param"] == "purpose"
    assert error_of(post_file({"file": ("a.jsonl", ok_line)}, {"purpose": "fine-tune"}), 400)["param"] == "purpose"
    assert error_of(post_file({"purpose": (None, b"batch")}), 400)["param"] == "file"
    assert error_of(post_file({"file": (None, ok_line)}, {"purpose": "batch"}), 400)["param"] == "file"  # no filename
    assert error_of(post_file({"file": ("big.jsonl", ok_line * 800)}, {"purpose": "batch"}), 413)["param"] == "file"
    assert error_of(post_file({"file": ("long.jsonl", ok_line * 21)}, {"purpose": "batch"}), 400)["param"] == "file"
    r = httpx.post(f"{base}/v1/files", content=b"--b\r\nno headers end", timeout=30,
                   headers={"content-type": "multipart/form-data; boundary=b"})
    assert error_of(r, 400)["code"] == "invalid_multipart"
    source = post_file({"file": ("ok.jsonl", ok_line)}, {"purpose": "batch"}).json()
    create = lambda **body: httpx.post(f"{base}/v1/batches", json={  # noqa: E731
        "input_file_id": source["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h", **body},
        timeout=30)
    assert error_of(create(endpoint="/v1/moderations"), 400)["param"] == "endpoint"
    assert error_of(create(completion_window="48h"), 400)["param"] == "completion_window"
    assert error_of(create(input_file_id=NO_FILE), 404)["param"] == "input_file_id"
    assert error_of(create(input_file_id="../../etc/passwd"), 404)["param"] == "input_file_id"
    assert error_of(create(input_file_id=7), 400)["param"] == "input_file_id"
    assert error_of(create(metadata={f"k{i}": "v" for i in range(17)}), 400)["param"] == "metadata"
    assert error_of(httpx.post(f"{base}/v1/batches", json={"endpoint": "/v1/completions"}), 400)["param"]
    done = wait(sdk_client(srv), create().json()["id"])
    assert error_of(create(input_file_id=done.output_file_id), 400)["param"] == "input_file_id"  # a batch_output file
    assert error_of(httpx.post(f"{base}/v1/batches/{done.id}/cancel"), 409)["code"] == "conflict"
    for path in (f"/v1/files/{NO_FILE}", f"/v1/files/{NO_FILE}/content", f"/v1/batches/{NO_BATCH}",
                 "/v1/files/..%2F..%2Fetc%2Fpasswd", "/v1/files/file-../content", "/v1/batches/batch_x"):
        assert httpx.get(f"{base}{path}", timeout=30).status_code == 404, path
    assert error_of(httpx.delete(f"{base}/v1/files/{NO_FILE}"), 404)["code"] == "not_found"
    assert error_of(httpx.post(f"{base}/v1/batches/{NO_BATCH}/cancel"), 404)["code"] == "not_found"
    assert error_of(httpx.get(f"{base}/v1/batches?limit=0"), 400)["param"] == "limit"
    assert error_of(httpx.get(f"{base}/v1/batches?limit=101"), 400)["param"] == "limit"
    assert error_of(httpx.get(f"{base}/v1/batches?after={NO_BATCH}"), 400)["param"] == "after"
    assert error_of(httpx.get(f"{base}/v1/files?order=up"), 400)["param"] == "order"
    assert error_of(httpx.get(f"{base}/v1/files?after=x"), 400)["param"] == "after"


def test_lists_page_and_files_are_bounded(srv):
    client = sdk_client(srv)
    page = raw_get(srv, "/v1/batches?limit=2")
    validate("ListBatchesResponse", page)
    assert len(page["data"]) == 2 and page["has_more"]
    following = raw_get(srv, f"/v1/batches?limit=2&after={page['last_id']}")
    assert following["data"][0]["created_at"] <= page["data"][-1]["created_at"]
    assert not {b["id"] for b in following["data"]} & {b["id"] for b in page["data"]}
    assert len(list(client.batches.list(limit=1))) == len(raw_get(srv, "/v1/batches?limit=100")["data"])
    files = raw_get(srv, "/v1/files?purpose=batch_output&order=asc")
    validate("ListFilesResponse", files)
    assert files["data"] and {f["purpose"] for f in files["data"]} == {"batch_output"}
    made = []
    for _ in range(40):  # --files-max-count 40: an upload past it is refused, never a file evicted
        r = httpx.post(f"{srv.base_url}/v1/files", files={"file": ("f.jsonl", b"{}\n")}, data={"purpose": "batch"})
        if r.status_code != 200:
            assert error_of(r, 400)["code"] == "too_many_files"
            break
        made.append(r.json()["id"])
    else:
        raise AssertionError("no upload was refused")
    deleted = client.files.delete(made[0])
    assert deleted.deleted and deleted.id == made[0]
    assert httpx.get(f"{srv.base_url}/v1/files/{made[0]}/content").status_code == 404
    for file_id in made[1:]:
        client.files.delete(file_id)


def test_restart_resumes_and_deadline_expires(tiny, tmp_path_factory):
    """Stopped while a batch runs, the server resumes it on start: every line once. A second batch,
    still waiting, is past its deadline when the server comes back: it expires, its lines in the
    error file as `batch_expired`."""
    store = tmp_path_factory.mktemp("batch-restart") / "state.db"
    flags = (*tiny_flags(tiny, store), "--batch-concurrency", "1")
    srv = start_server(tmp_path_factory, *flags)
    client = sdk_client(srv)
    # Two short lines, then long ones: the stop comes after the two, while the long ones still have seconds to run.
    lines = [line(f"r{i}", chat(i % 8, 8 if i < 2 else LONG)) for i in range(8)]
    running = client.batches.create(input_file_id=upload(client, lines).id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    late = client.batches.create(input_file_id=upload(client, [line(f"l{i}", chat(i)) for i in range(3)]).id,
                                 endpoint="/v1/chat/completions", completion_window="24h")
    wait(client, running.id, lambda b: b.request_counts.completed >= 2)
    stop_server(srv)  # the store and the files stay
    with sqlite3.connect(store) as conn:
        ((status,),) = conn.execute("SELECT status FROM batches WHERE id = ?", (running.id,)).fetchall()
        ((body,),) = conn.execute("SELECT body FROM batches WHERE id = ?", (late.id,)).fetchall()
        assert status == "in_progress"
        conn.execute("UPDATE batches SET body = ? WHERE id = ?",
                     (json.dumps({**json.loads(body), "expires_at": int(time.time()) - 1}), late.id))
    done_before = len((store.parent / "files" / f"{running.id}.output.jsonl").read_bytes().splitlines())
    assert 2 <= done_before < 8
    srv = start_server(tmp_path_factory, *flags)
    try:
        client = sdk_client(srv)
        batch = wait(client, running.id)
        assert batch.status == "completed" and batch.request_counts.completed == 8, batch
        output = records(client, batch.output_file_id)
        assert sorted(r["custom_id"] for r in output) == sorted(f"r{i}" for i in range(8))  # none twice
        expired = wait(client, late.id)
        assert expired.status == "expired" and expired.expired_at, expired
        assert expired.request_counts.completed == 0 and expired.request_counts.failed == 3
        errors = records(client, expired.error_file_id)
        assert {r["custom_id"] for r in errors} == {"l0", "l1", "l2"}
        assert all(r["response"] is None and r["error"]["code"] == "batch_expired" for r in errors)
        validate("Batch", raw_get(srv, f"/v1/batches/{late.id}"))
    finally:
        stop_server(srv)
