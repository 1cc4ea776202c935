"""HTTP calls to a test server: a JSON POST, its SSE events and chunks, and the check of an OpenAI error body."""
from __future__ import annotations

import json

import httpx

from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"



HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]



def sse_events(response: httpx.Response) -> list[str]:
    """Raw SSE lines of a streamed response: data payloads and comments."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(line[len("data: "):])
        elif line.startswith(":"):
            events.append(line)
    return events



def post(server, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120, **kw)


def stream_chunks(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.base_url}{path}", json={"model": MODEL, **body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        events = [e for e in sse_events(r) if not e.startswith(":")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def check_error(resp: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    validate("ErrorResponse", body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    if param is not None:
        assert body["error"]["param"] == param
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]
