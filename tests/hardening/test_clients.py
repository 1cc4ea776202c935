"""Hardening: clients that vanish. 200 mixed requests, a third cut off at a random point; afterwards
the engine holds nothing (no running or waiting request, every KV block free) and serves normally."""
from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import time

import httpx

from tests.helpers.server import TINY_MODEL, stats

NUM_REQUESTS = 200
CONCURRENCY = 24
# Where a client vanishes. A stream can also be cut after its headers or a few events in.
CUTS = ["before_body", "mid_body", "after_request"]
STREAM_CUTS = [*CUTS, "after_headers", "mid_stream"]


def request_body(rng: random.Random, i: int, cut: bool) -> tuple[str, dict]:
    # A cut request asks for many tokens, so that it is still generating when its client goes.
    max_tokens = 200 if cut else rng.randint(1, 12)
    common = {"model": TINY_MODEL, "max_tokens": max_tokens, "ignore_eos": cut, "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": f"Request {i}"}]}
    return "/v1/completions", {**common, "prompt": f"Request {i} says"}


async def vanish(port: int, path: str, body: dict, cut: str, rng: random.Random) -> None:
    """Send the request over a raw socket and leave at `cut`, by FIN or (every other time) RST."""
    raw = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if rng.random() < 0.5:  # linger 0: close() sends a reset instead of a FIN
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (path.encode(), len(raw)))
        if cut == "mid_body":
            writer.write(raw[: rng.randrange(1, len(raw))])
        elif cut != "before_body":
            writer.write(raw)
        await writer.drain()
        if cut == "after_request":
            await asyncio.sleep(rng.uniform(0, 0.3))
        elif cut in ("after_headers", "mid_stream"):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert head.startswith(b"HTTP/1.1 200"), head
            for _ in range(rng.randint(1, 8) if cut == "mid_stream" else 0):
                await asyncio.wait_for(reader.readuntil(b"\n\n"), 30)
        else:
            await asyncio.sleep(rng.uniform(0, 0.05))
    finally:
        writer.close()


async def complete(client: httpx.AsyncClient, path: str, body: dict) -> str | None:
    """Run the request to its end; why it went wrong, or None."""
    if body["stream"]:
        async with client.stream("POST", path, json=body) as resp:
            events = [line async for line in resp.aiter_lines() if line.startswith("data:")]
        # An error event is a frame with an "error" key; the text "error" may be a random model's content.
        frames = [json.loads(e[5:]) for e in events if e != "data: [DONE]"]
        if resp.status_code != 200 or events[-1:] != ["data: [DONE]"] or any("error" in f for f in frames):
            return f"stream {resp.status_code}: {events[-2:]}"
        return None
    resp = await client.post(path, json=body)
    if resp.status_code != 200 or not resp.json().get("choices"):
        return f"{resp.status_code}: {resp.text[:200]}"
    return None


async def mixed_load(base_url: str, port: int, seed: int) -> tuple[list[str], dict[str, int]]:
    rng = random.Random(seed)
    plan = []
    for i in range(NUM_REQUESTS):
        cut = None
        if i % 3 == 0:
            path, body = request_body(rng, i, cut=True)
            cut = rng.choice(STREAM_CUTS if body["stream"] else CUTS)
        else:
            path, body = request_body(rng, i, cut=False)
        plan.append((path, body, cut, random.Random(rng.random())))
    seats = asyncio.Semaphore(CONCURRENCY)
    failures: list[str] = []
    cut_counts: dict[str, int] = {}

    async def run(client, path, body, cut, own_rng):
        async with seats:
            if cut is None:
                if (why := await complete(client, path, body)) is not None:
                    failures.append(f"{path} {body}: {why}")
            else:
                cut_counts[cut] = cut_counts.get(cut, 0) + 1
                await vanish(port, path, body, cut, own_rng)

    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        await asyncio.gather(*(run(client, *step) for step in plan))
    return failures, cut_counts


def wait_idle(server, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        figures = stats(server)
        idle = figures["num_running"] == figures["num_waiting"] == 0
        if idle and figures["num_free_blocks"] == figures["num_total_blocks"]:
            return figures
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine still holds work: {figures}")
        time.sleep(0.1)


def test_vanishing_clients_leave_nothing_behind(tiny_server):
    before = wait_idle(tiny_server)
    started = time.monotonic()
    failures, cut_counts = asyncio.run(mixed_load(tiny_server.base_url, tiny_server.port, seed=8))
    print(f"\n{NUM_REQUESTS} requests, cuts {cut_counts}, in {time.monotonic() - started:.1f} s")
    assert not failures, "\n".join(failures[:20])
    assert set(cut_counts) == set(STREAM_CUTS) and sum(cut_counts.values()) == -(-NUM_REQUESTS // 3)
    after = wait_idle(tiny_server)
    # A request whose client left after sending it all was still generating its 200 tokens (a
    # few may have finished first on a fast machine): the engine aborted it.
    num_aborted = after["num_aborted"] - before["num_aborted"]
    num_submitted = sum(n for cut, n in cut_counts.items() if cut not in ("before_body", "mid_body"))
    print(f"engine aborted {num_aborted} of the {num_submitted} cut requests it had")
    assert 0.8 * num_submitted <= num_aborted <= num_submitted, (before, after)
    chat = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    resp = httpx.post(f"{tiny_server.base_url}/v1/chat/completions", json=chat, timeout=30)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
    with httpx.stream("POST", f"{tiny_server.base_url}/v1/completions", timeout=30,
                      json={"model": TINY_MODEL, "prompt": "Hi", "max_tokens": 5, "stream": True}) as r:
        assert [line for line in r.iter_lines() if line][-1] == "data: [DONE]"
    assert "Traceback" not in tiny_server.log_path.read_text(errors="replace")
