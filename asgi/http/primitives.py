"""The ASGI primitives: read a declared-JSON body with a limit, answer JSON, and watch for a disconnect.

Granian does not raise on `send()` after the client left, so a request that streams or waits
on the engine runs a DisconnectWatcher: it owns `receive()` once the body is read, and its
event is how the handler learns the client is gone.
"""
from __future__ import annotations

import asyncio

from rill.asgi.errors import APIError


class ClientDisconnected(Exception):
    pass


def _unsupported(message: str) -> APIError:
    return APIError(415, message, code="unsupported_media_type")


async def read_json_body(headers: list[tuple[bytes, bytes]], receive, limit_bytes: int) -> bytes:
    """A POST's body, which must be declared JSON (`application/json` or a `+json` type), else 415.

    A missing Content-Type is refused too (FastAPI reads it as JSON): a web page can send a body
    without one, or as text/plain or a form, cross-origin and with no CORS preflight, so reading
    such a body would let any site its users visit drive a keyless server. An empty body with no
    type declares nothing and is let through (`POST .../cancel` needs no body). A body declared as
    something else is refused before it is read.
    """
    declared = None
    for name, value in headers:
        if name.lower() == b"content-type":
            declared = value.split(b";", 1)[0].strip().lower()
            if declared != b"application/json" and not declared.endswith(b"+json"):
                shown = declared.decode("latin-1")[:100]
                raise _unsupported(f"Content-Type must be application/json, not `{shown}`.")
            break
    body = await read_body(receive, limit_bytes)
    if declared is None and body:
        raise _unsupported("A request body needs `Content-Type: application/json`.")
    return body


async def read_body(receive, limit_bytes: int) -> bytes:
    """The whole request body; 413 past limit_bytes; ClientDisconnected if the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise APIError(413, f"Request body is larger than the limit of {limit_bytes} bytes.",
                           code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_response(send, status: int, body: bytes, content_type: bytes = b"application/json",
                        headers: list[tuple[bytes, bytes]] | None = None) -> None:
    all_headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if headers:
        all_headers.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


class DisconnectWatcher:
    """Owns receive() after the body; `.gone` is set when the client disconnects."""

    def __init__(self, receive, on_disconnect=None):
        self.gone = asyncio.Event()
        self._on_disconnect = on_disconnect
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                if self._on_disconnect is not None:
                    self._on_disconnect()
                return

    def stop(self) -> None:
        self._task.cancel()
