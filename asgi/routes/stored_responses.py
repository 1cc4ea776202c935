"""The stored responses' routes: GET and DELETE /v1/responses/{id}, its input_items, and cancel."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from asgi.errors import APIError
from asgi.http.primitives import send_response
from asgi.routes.conversations import list_page
from asgi.routes.responses import stored_or_404
from asgi.state import WorkerState

PREFIX = "/v1/responses/"
Handler = Callable[..., Awaitable[None]]


def responses_route(method: str, path: str, query: bytes = b"") -> Handler | None:
    """The handler for a path under /v1/responses/{id}, or None."""
    if not path.startswith(PREFIX):
        return None
    parts = path[len(PREFIX):].split("/")
    if len(parts) == 1 and parts[0]:
        target = {"GET": retrieve, "DELETE": delete}.get(method)
    elif len(parts) == 2 and parts[1] == "input_items" and method == "GET":
        target = list_input_items
    elif len(parts) == 2 and parts[1] == "cancel" and method == "POST":
        target = cancel
    else:
        return None
    if target is None:
        return None

    async def handler(state, body, receive, send):
        await target(state, parts[0], query, send)

    return handler


async def retrieve(state: WorkerState, response_id: str, query: bytes, send) -> None:
    await send_response(send, 200, msgspec.json.encode(stored_or_404(state, response_id).response))


async def delete(state: WorkerState, response_id: str, query: bytes, send) -> None:
    stored_or_404(state, response_id)
    state.responses_store.delete(response_id)
    await send_response(send, 200, msgspec.json.encode({"id": response_id, "object": "response", "deleted": True}))


async def cancel(state: WorkerState, response_id: str, query: bytes, send) -> None:
    """Only a response still in progress can be cancelled; its engine work is aborted."""
    entry = stored_or_404(state, response_id)
    if entry.cancel is None:
        raise APIError(400, f"The response `{response_id}` is not in progress (its status is "
                            f"{entry.response['status']}); only a response in progress can be cancelled.",
                       param="response_id")
    entry.cancel()
    await send_response(send, 200, msgspec.json.encode({**entry.response, "status": "cancelled"}))


async def list_input_items(state: WorkerState, response_id: str, query: bytes, send) -> None:
    """OpenAI's page: `limit` (1 to 100, default 20), `order` (desc by default), `after` an item id."""
    entry = stored_or_404(state, response_id)
    await send_response(send, 200, msgspec.json.encode(list_page(entry.input_items, query, response_id)))
