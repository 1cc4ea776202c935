"""Server-sent events: headers, `data:` frames, keep-alives and the closing [DONE]."""
from __future__ import annotations

import time

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx would otherwise buffer the stream
]
KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


def frame(payload: bytes) -> bytes:
    """One event; payload is compact JSON, which never holds a raw newline."""
    return b"data: " + payload + b"\n\n"


class SSEWriter:
    """Writes one event stream; remembers when it last sent, for keep-alives.

    One task writes each stream (the request's own loop), so no lock is needed: the
    keep-alive is sent by that loop when its wait for engine output times out.
    """

    def __init__(self, send, keepalive_s: float, keepalive: bytes = KEEPALIVE,
                 headers: list[tuple[bytes, bytes]] = SSE_HEADERS):
        self._send = send
        self.headers = headers
        self.keepalive_s = keepalive_s
        self.keepalive_frame = keepalive  # the comment, or a route's own event (a Message stream's ping)
        self.last_send = time.monotonic()
        self.started = False

    async def start(self) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": self.headers})
        self.started = True
        await self._write(b"")

    async def data(self, payload: bytes) -> None:
        await self._write(frame(payload))

    async def event(self, raw: bytes) -> None:
        """A whole event framed by the caller (a named event, as nvext's annotations)."""
        await self._write(raw)

    async def keepalive(self) -> None:
        await self._write(self.keepalive_frame)

    def keepalive_due_in(self) -> float:
        return self.keepalive_s - (time.monotonic() - self.last_send)

    async def done(self) -> None:
        await self._send({"type": "http.response.body", "body": DONE, "more_body": False})

    async def close(self) -> None:
        """Ends a stream that has no [DONE] (the Responses API's typed events)."""
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write(self, body: bytes) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": True})
        self.last_send = time.monotonic()
