"""The stored responses' routes: GET and DELETE /v1/responses/{id}, its input_items, and cancel."""
from __future__ import annotations

from urllib.parse import parse_qs

import msgspec

from rill.asgi.engine_link.generate import engine_id
from rill.asgi.errors import APIError
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.event_log import send_events
from rill.asgi.routes.conversations import page, page_query
from rill.asgi.routes.responses import stored_or_404
from rill.asgi.stores.base import Page

# GET ?stream=true readers a worker serves at once, for each of --max-num-seqs: each holds a connection and, off the
# worker that runs its response, polls the store (asgi/output/event_log.py).
READERS_PER_SEQ = 4


async def retrieve(http: HTTPRequest) -> None:
    """The Response; with `stream=true`, a background stream's events after `starting_after` (from the first
    without), and the rest as they come (asgi/output/event_log.py)."""
    response_id = http.params["response_id"]
    stream, after = stream_query(http.query)
    entry = await stored_or_404(http.state, response_id)
    if not stream:
        await send_response(http.send, 200, msgspec.json.encode(entry.response))
        return
    if entry.events is None:
        raise APIError(400, f"The response `{response_id}` was not created with `background` and `stream`: only such "
                            "a response's events are kept, to be streamed again. GET it without `stream`.",
                       param="stream")
    state = http.state
    if state.event_readers >= (bound := READERS_PER_SEQ * state.settings.limits.max_num_seqs):
        raise APIError(429, f"This worker streams at most {bound} stored responses at once (4 for each of "
                            "--max-num-seqs); retry once one has ended.", type="requests", param="stream",
                       code="rate_limit_exceeded", headers=[(b"retry-after", b"1")])
    state.event_readers += 1
    try:
        await send_events(http, response_id, after)
    finally:
        state.event_readers -= 1


def stream_query(query: bytes) -> tuple[bool, int]:
    """`stream` (true or false) and `starting_after` (a sequence number, -1 when absent: from the first event);
    `include_obfuscation` is taken and ignored (no padding is added)."""
    args = {k: v[-1] for k, v in parse_qs(query.decode("latin-1")).items()}
    stream = args.get("stream", "false").lower()
    if stream not in ("true", "false", "1", "0"):
        raise APIError(400, "`stream` must be true or false.", param="stream")
    after = args.get("starting_after")
    if after is not None and not (after.isascii() and after.isdigit() and len(after) <= 12):
        raise APIError(400, "`starting_after` must be a sequence number: an integer from 0.", param="starting_after")
    return stream in ("true", "1"), -1 if after is None else int(after)


async def delete(http: HTTPRequest) -> None:
    response_id = http.params["response_id"]
    await stored_or_404(http.state, response_id)
    await http.state.store.delete_response(response_id)
    await send_response(http.send, 200, msgspec.json.encode({"id": response_id, "object": "response", "deleted": True}))


async def cancel(http: HTTPRequest) -> None:
    """Only a response still in progress can be cancelled; its engine work is aborted. On the
    worker that runs it the cancel is direct; from another worker it goes through the engine,
    which ends the request with CANCELLED for its worker to finish the Response as cancelled."""
    response_id = http.params["response_id"]
    entry = await stored_or_404(http.state, response_id)
    if entry.response["status"] != "in_progress":
        raise APIError(400, f"The response `{response_id}` is not in progress (its status is "
                            f"{entry.response['status']}); only a response in progress can be cancelled.",
                       param="response_id")
    if (local := http.state.in_progress.get(response_id)) is not None:
        local()
    else:
        await http.state.client.cancel([engine_id(response_id, 0)])  # a response has one choice
    await send_response(http.send, 200, msgspec.json.encode({**entry.response, "status": "cancelled"}))


async def list_input_items(http: HTTPRequest) -> None:
    """OpenAI's page (`limit`, `order`, `after`), read as one page from the store."""
    response_id = http.params["response_id"]
    store = http.state.store
    got = await store.page_response_items(response_id, *page_query(http.query)) if store.responses.enabled else None
    if got is None:
        await stored_or_404(http.state, response_id)  # raises its 404, which says why
        got = Page([], False)  # stored between the two reads
    await send_response(http.send, 200, msgspec.json.encode(page(got)))
