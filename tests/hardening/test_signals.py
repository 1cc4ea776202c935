"""Every signal has a meaning: SIGHUP to the engine or an API worker is ignored, SIGHUP to the
launcher drains and stops as SIGTERM does, and a worker killed mid-stream leaves no engine request
running for nobody (it is replaced, the server goes on)."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.server import TINY_MODEL, child_pids, leftovers, start_server, stats

# Long enough never to end by itself during a test (the tiny model's context is 8192).
ENDLESS = {"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def hup_server(tmp_path_factory):
    """Two API workers; a 2 s drain, so that SIGHUP's drain ends an endless stream quickly."""
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--max-model-len", "8192", "--workers", "2", "--kv-cache-memory", "64MiB",
                       "--shutdown-timeout", "2", "--log-level", "info")
    yield srv
    srv.stop()  # stopped already by the last test, unless it failed


def wait_for(predicate, timeout_s: float, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if value := predicate():
                return value
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise AssertionError("condition not met in time")


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def children(pid: int) -> list[int]:
    return [child for child in child_pids(pid) if running(child)]


def api_workers(server) -> list[int]:
    """The launcher's children that are Granian workers (not the engine, not multiprocessing's helper)."""
    engines = {e["pid"] for e in stats(server)["engines"]}
    return [pid for pid in children(server.proc.pid)
            if pid not in engines and b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]


def open_stream(server) -> socket.socket:
    """An endless completion stream on a raw connection, its headers and first chunk read."""
    body = json.dumps(ENDLESS).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    first = sock.recv(4096)
    assert first.startswith(b"HTTP/1.1 200"), first
    return sock


def read_to_end(sock: socket.socket, timeout_s: float = 30) -> bytes:
    sock.settimeout(timeout_s)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
        if b"data: [DONE]" in b"".join(chunks[-2:]):
            break
    return b"".join(chunks)


def worker_holding(sock: socket.socket, server, workers: list[int]) -> int:
    """The API worker that holds the server side of this connection (by the socket's inode)."""
    client_port = sock.getsockname()[1]
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port, remote_port = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
            if local_port == server.port and remote_port == client_port:
                inode = fields[9]
    assert inode is not None, "the server side of the connection was not found"
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    raise AssertionError("no worker holds the connection")


def idle(server) -> dict | None:
    figures = stats(server)
    return figures if figures["num_running"] == 0 and figures["num_waiting"] == 0 else None


def test_sighup_to_the_engine_is_ignored(hup_server):
    """A terminal hangup reaches the launcher's whole process group, the engine included."""
    engine = stats(hup_server)["engines"][0]["pid"]
    os.kill(engine, signal.SIGHUP)
    time.sleep(0.5)
    assert running(engine), "SIGHUP killed the engine"
    r = httpx.post(f"{hup_server.base_url}/v1/completions", json={"model": TINY_MODEL, "prompt": "a", "max_tokens": 3},
                   timeout=30)
    assert r.status_code == 200, r.text


def test_sighup_to_a_worker_is_ignored(hup_server):
    """A worker's stream goes on to its end; the worker stays."""
    workers = api_workers(hup_server)
    assert len(workers) == 2, workers
    with httpx.stream("POST", f"{hup_server.base_url}/v1/completions", timeout=30,
                      json={**ENDLESS, "max_tokens": 40}) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        for pid in workers:
            os.kill(pid, signal.SIGHUP)
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert all(running(pid) for pid in workers) and sorted(api_workers(hup_server)) == sorted(workers)


def test_a_killed_worker_leaves_no_engine_request_behind(hup_server):
    """kill -9 of the worker that owns a stream: the engine ends that request at once (nobody
    reads it), the worker is replaced, and the server goes on."""
    workers = api_workers(hup_server)
    before = wait_for(lambda: idle(hup_server), 10)["num_aborted"]
    with open_stream(hup_server) as sock:
        victim = worker_holding(sock, hup_server, workers)
        assert stats(hup_server)["num_running"] == 1
        os.kill(victim, signal.SIGKILL)
        after = wait_for(lambda: idle(hup_server), 5)  # the other worker answers /stats meanwhile
        assert after["num_aborted"] == before + 1
        assert b"data: [DONE]" not in read_to_end(sock)  # cut: its worker is gone
    assert hup_server.proc.poll() is None, "a dead worker stopped the whole server"
    new = wait_for(lambda: (w := api_workers(hup_server)) and len(w) == 2 and victim not in w and w, 30)
    assert set(workers) - {victim} <= set(new)
    for _ in range(4):  # both workers serve (connections alternate between them)
        r = httpx.post(f"{hup_server.base_url}/v1/completions", json={"model": TINY_MODEL, "prompt": "a",
                                                                      "max_tokens": 3}, timeout=30)
        assert r.status_code == 200, r.text


def test_sighup_to_the_launcher_drains_and_stops(hup_server):
    """As SIGTERM: the stream in progress ends with an event and [DONE] (here after the 2 s drain,
    as an error), then the server stops with status 0 and leaves nothing behind. Last in this
    module: it stops the server."""
    workers = api_workers(hup_server)
    engine = stats(hup_server)["engines"][0]["pid"]
    with open_stream(hup_server) as sock:
        os.kill(hup_server.proc.pid, signal.SIGHUP)
        body = read_to_end(sock)
    # Ended by the drain's timeout: an error event, then [DONE].
    assert body.index(b'"code":"shutting_down"') < body.index(b"data: [DONE]"), body[-300:]
    assert hup_server.proc.wait(30) == 0, hup_server.log()
    assert not any(running(pid) for pid in [*workers, engine])
    assert leftovers(hup_server.proc.pid) == []
