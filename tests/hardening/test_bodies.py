"""Hardening: a few hundred generated bad bodies (tests/helpers/bad_bodies.py) get a 4xx OpenAI error, never a 5xx."""
from __future__ import annotations

import time

import httpx

from tests.helpers.bad_bodies import CHAT, generate, problem
from tests.helpers.server import TINY_MODEL, stats


def test_generated_bad_bodies_get_openai_4xx_errors(tiny_server):
    cases = generate(TINY_MODEL)
    assert len(cases) > 600
    failures = []
    started = time.monotonic()
    # Two keep-alive connections at most: the server must keep each usable after a bad body.
    with httpx.Client(base_url=tiny_server.base_url, timeout=60, limits=httpx.Limits(max_connections=2)) as client:
        for case in cases:
            try:
                resp = client.post(case.path, content=case.body, headers=case.headers())
            except httpx.HTTPError as exc:  # a 413 may be sent before the whole body is: retry reads it
                failures.append(f"{case.path} {case.label}: {exc!r}")
                continue
            if (why := problem(resp, case.expected, case.path)) is not None:
                failures.append(f"{case.path} {case.label}: {why}")
        print(f"\n{len(cases)} bad bodies in {time.monotonic() - started:.1f} s")
        assert not failures, f"{len(failures)} of {len(cases)} wrong:\n" + "\n".join(failures[:40])
        # The server is still whole: a normal request is served, nothing is left in the engine.
        ok = client.post(CHAT, json={"model": TINY_MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                     "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None
    figures = stats(tiny_server)
    assert figures["num_running"] == figures["num_waiting"] == 0
