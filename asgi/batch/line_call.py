"""One batch line sent through its route's own handler, in this process: no HTTP loopback.

The handler gets an HTTPRequest as App.route would build it (the line's body, no headers) with
an ASGI `send` that keeps the status and the body, and a `receive` that reports a disconnect when
the batch aborts its lines (a cancel, an expiry, a shutdown): the route then aborts its engine
work as it does for a client that left. Errors become the status and OpenAI error body the
client of the route would have got.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from rill.asgi.errors import APIError, error_body
from rill.asgi.http.primitives import ClientDisconnected
from rill.asgi.http.request_context import RequestContext, set_current
from rill.asgi.http.router import Handler, HTTPRequest
from rill.asgi.stores.base import StoreUnavailable

log = logging.getLogger("rill.batch")


# Under --scheduling-policy priority every line runs at this priority (lower runs first): behind interactive
# requests at the usual 0, and, aging a level a --priority-aging period, never starved (docs/priority.md).
BATCH_PRIORITY = 100


def at_batch_priority(body: bytes) -> bytes:
    """The line's body with BATCH_PRIORITY as its `priority` (a body that is no JSON object is left to the route)."""
    try:
        fields = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body
    if not isinstance(fields, dict):
        return body
    return msgspec.json.encode({**fields, "priority": BATCH_PRIORITY})


@dataclass(frozen=True)
class Answer:
    status_code: int
    request_id: str
    body: bytes


class LineCaller:
    """`handler_for(url)`: the route's handler for POST `url` (the app's router)."""

    def __init__(self, state, handler_for: Callable[[str], Handler | None]):
        self.state = state
        self.handler_for = handler_for

    async def call(self, url: str, body: bytes, abort: asyncio.Event) -> Answer | None:
        """The route's answer, or None when the line was aborted before it answered."""
        handler = self.handler_for(url)
        request_id = f"req_{uuid.uuid4().hex}"
        if handler is None:  # the runner checked the endpoint: a bug, answered as the router would
            return Answer(404, request_id, error_body(f"Unknown path: {url}", "invalid_request_error"))
        limit = self.state.settings.http.max_body_bytes
        if len(body) > limit:  # what App.route answers a client's body past --max-request-body
            return Answer(413, request_id, error_body(f"Request body is larger than the limit of {limit} bytes.",
                                                      "invalid_request_error", code="request_too_large"))
        if self.state.settings.limits.scheduling_policy == "priority":
            body = at_batch_priority(body)
        status, chunks = 0, []

        async def send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        async def receive() -> dict:
            await abort.wait()
            return {"type": "http.disconnect"}

        set_current(RequestContext(request_id, "POST", url))  # this task's own (a task copies the context)
        try:
            await handler(HTTPRequest(self.state, receive, send, body=body))
        except APIError as exc:
            return Answer(exc.status, request_id, exc.body())
        except ClientDisconnected:
            return None
        except StoreUnavailable as exc:
            return Answer(503, request_id, error_body(f"The state store is unavailable: {exc}.", "server_error",
                                                      code="store_unavailable"))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch line on %s failed", url)
            return Answer(500, request_id, error_body("Internal server error.", "server_error"))
        if status == 0 or abort.is_set() and status != 200:
            return None  # aborted before it answered
        return Answer(status, request_id, b"".join(chunks))
