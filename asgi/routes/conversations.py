"""OpenAI's Conversations routes: a conversation's metadata and items, kept in the state store.

A response created with `conversation` reads the conversation's items before its input, and
when it ends its input and output items are appended. Conversations are bounded by their own
count, TTL (from creation) and bytes, enforced by the store across every API worker; lists read
one page from the store.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Annotated, Any
from urllib.parse import parse_qs

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.bounds import Metadata
from rill.asgi.requests.responses_input import items_to_messages, typed_items
from rill.asgi.state import WorkerState
from rill.asgi.stores.base import MAX_CONVERSATION_ITEMS, MAX_PAGE, Conversation, Order, Page
from rill.asgi.stores.items import Refused, stored_items

log = logging.getLogger("rill.store")

MAX_ITEMS_PER_CALL = 20  # as OpenAI: items of one create or add call


class ConversationBody(msgspec.Struct):
    items: Annotated[list[dict[str, Any]], Meta(max_length=MAX_ITEMS_PER_CALL)] | None = None
    metadata: Metadata | None = None


_body = msgspec.json.Decoder(ConversationBody)


def _decode(body: bytes) -> ConversationBody:
    req = decode_json(_body, body or b"{}")
    items = typed_items(req.items or [], "items")
    items_to_messages(items, "items")  # the same checks a response's input gets
    req.items = stored_items(items, "items")  # what the store keeps, and so what is echoed
    return req


def conversation_id_of(param: Any) -> str | None:
    """`conversation` of a response request: an id, or {"id": ...}."""
    if param is None or isinstance(param, str):
        return param
    if isinstance(param, dict) and isinstance(param.get("id"), str):
        return param["id"]
    raise APIError(400, '`conversation` must be a conversation id or {"id": ...}.', param="conversation")


def _gone(conversation_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No conversation with id `{conversation_id}` found: it was never created, was deleted, "
                         "expired or was evicted.", param=param, code="not_found")


async def conversation_or_404(state: WorkerState, conversation_id: str, param: str | None = None) -> Conversation:
    conv = await state.store.get_conversation(conversation_id)
    if conv is None:
        raise _gone(conversation_id, param)
    return conv


async def items_or_404(state: WorkerState, conversation_id: str, param: str | None = None) -> list[dict[str, Any]]:
    """Every item, for a response's prompt: a 400 before any work if the conversation has no
    room left for the turn (it is full in items or bytes)."""
    got = await state.store.all_items(conversation_id)
    if got is None:
        raise _gone(conversation_id, param)
    items, num_bytes = got
    if len(items) >= MAX_CONVERSATION_ITEMS or num_bytes >= state.store.conversations.max_entry_bytes:
        raise APIError(400, f"The conversation `{conversation_id}` is full ({len(items)} items, {num_bytes} bytes; "
                            f"at most {MAX_CONVERSATION_ITEMS} items and {state.store.conversations.max_entry_bytes} "
                            "bytes): start another.", param=param, code="conversation_full")
    return items


async def append_items(state: WorkerState, conversation_id: str, items: list[dict[str, Any]]) -> None:
    """A finished response's input and output items join its conversation (if it is still stored
    and has room: the client has its answer already, so a turn that does not fit is logged and
    not kept)."""
    try:
        await state.store.add_items(conversation_id, items)
    except Refused as exc:
        log.warning("a turn of conversation %s was not kept: %s", conversation_id, exc.message)


async def create(http: HTTPRequest) -> None:
    store = http.state.store
    if not store.conversations.enabled:
        raise APIError(400, "Conversations are disabled on this server (--conversations-store-max-entries or "
                            "--conversations-store-ttl is 0).", param="conversation")
    req = _decode(http.body)
    conv = Conversation(id=f"conv_{uuid.uuid4().hex}", created_at=int(time.time()), metadata=req.metadata or {})
    await store.put_conversation(conv, req.items)
    await send_response(http.send, 200, msgspec.json.encode(conv.resource()))


async def retrieve(http: HTTPRequest) -> None:
    conv = await conversation_or_404(http.state, http.params["conversation_id"])
    await send_response(http.send, 200, msgspec.json.encode(conv.resource()))


async def update(http: HTTPRequest) -> None:
    conv = await conversation_or_404(http.state, http.params["conversation_id"])
    req = _decode(http.body)
    if req.metadata is None:
        raise APIError(400, "`metadata` is required.", param="metadata")
    conv.metadata = req.metadata
    await http.state.store.put_conversation(conv)
    await send_response(http.send, 200, msgspec.json.encode(conv.resource()))


async def delete(http: HTTPRequest) -> None:
    conversation_id = http.params["conversation_id"]
    if not await http.state.store.delete_conversation(conversation_id):
        raise _gone(conversation_id)
    await send_response(http.send, 200, msgspec.json.encode({"id": conversation_id, "object": "conversation.deleted",
                                                             "deleted": True}))


async def add_items(http: HTTPRequest) -> None:
    conversation_id = http.params["conversation_id"]
    await conversation_or_404(http.state, conversation_id)  # a 404 before a 400 about the body
    req = _decode(http.body)
    if not req.items:
        raise APIError(400, "`items` must hold at least one item.", param="items")
    if not await http.state.store.add_items(conversation_id, req.items):
        raise _gone(conversation_id)
    await send_response(http.send, 200, msgspec.json.encode(page(Page(req.items, False))))


def _item_404(conversation_id: str, item_id: str) -> APIError:
    return APIError(404, f"No item with id `{item_id}` in the conversation `{conversation_id}`.", code="not_found")


async def get_item(http: HTTPRequest) -> None:
    conversation_id, item_id = http.params["conversation_id"], http.params["item_id"]
    await conversation_or_404(http.state, conversation_id)
    item = await http.state.store.get_item(conversation_id, item_id)
    if item is None:
        raise _item_404(conversation_id, item_id)
    await send_response(http.send, 200, msgspec.json.encode(item))


async def delete_item(http: HTTPRequest) -> None:
    conversation_id, item_id = http.params["conversation_id"], http.params["item_id"]
    conv = await conversation_or_404(http.state, conversation_id)
    if not await http.state.store.delete_item(conversation_id, item_id):
        raise _item_404(conversation_id, item_id)
    await send_response(http.send, 200, msgspec.json.encode(conv.resource()))


async def list_items(http: HTTPRequest) -> None:
    conversation_id = http.params["conversation_id"]
    got = await http.state.store.page_items(conversation_id, *page_query(http.query))
    if got is None:
        raise _gone(conversation_id)
    await send_response(http.send, 200, msgspec.json.encode(page(got)))


def page(got: Page) -> dict:
    return {"object": "list", "data": got.items, "first_id": got.items[0]["id"] if got.items else None,
            "last_id": got.items[-1]["id"] if got.items else None, "has_more": got.has_more}


def page_query(query: bytes, default_order: Order = "desc") -> tuple[int, Order, str | None]:
    """OpenAI's list: `limit` (1 to 100, default 20), `order` (desc by default), `after` an item id."""
    args = {k: v[-1] for k, v in parse_qs(query.decode("latin-1")).items()}
    try:
        limit = int(args.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise APIError(400, f"`limit` must be an integer from 1 to {MAX_PAGE}.", param="limit")
    order = args.get("order", default_order)
    if order not in ("asc", "desc"):
        raise APIError(400, "`order` must be asc or desc.", param="order")
    return limit, order, args.get("after")
