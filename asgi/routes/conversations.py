"""OpenAI's Conversations: items kept per conversation in the worker's memory, and their routes.

A response created with `conversation` reads the conversation's items before its input, and
when it ends its input and output items are appended. Conversations live in their own store,
bounded like the responses' one, and, like it, in one API worker process.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import msgspec

from asgi.errors import APIError
from asgi.http.primitives import send_response
from asgi.requests.body import decode_json
from asgi.requests.responses_input import items_to_messages, typed_items
from asgi.requests.responses_request import check_metadata
from asgi.state import WorkerState

PREFIX = "/v1/conversations/"
MAX_ITEMS_PER_CALL = 20  # as OpenAI: items of one create call
Handler = Callable[..., Awaitable[None]]


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    items: list[dict[str, Any]] = field(default_factory=list)
    stored_at: float = 0.0

    def resource(self) -> dict:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


class ConversationBody(msgspec.Struct):
    items: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None


_body = msgspec.json.Decoder(ConversationBody)


def _decode(body: bytes) -> ConversationBody:
    req = decode_json(_body, body or b"{}")
    check_metadata(req.metadata)
    if req.items is not None and len(req.items) > MAX_ITEMS_PER_CALL:
        raise APIError(400, f"At most {MAX_ITEMS_PER_CALL} items can be added at once.", param="items")
    items = typed_items(req.items or [], "items")
    items_to_messages(items, "items")  # the same checks a response's input gets
    req.items = items
    return req


def conversation_id_of(param: Any) -> str | None:
    """`conversation` of a response request: an id, or {"id": ...}."""
    if param is None or isinstance(param, str):
        return param
    if isinstance(param, dict) and isinstance(param.get("id"), str):
        return param["id"]
    raise APIError(400, '`conversation` must be a conversation id or {"id": ...}.', param="conversation")


def conversation_or_404(state: WorkerState, conversation_id: str, param: str | None = None) -> Conversation:
    conv = state.conversations.get(conversation_id)
    if conv is None:
        raise APIError(404, f"No conversation with id `{conversation_id}` found: it was never created here, was "
                            "deleted, expired or evicted, or another API worker holds it.", param=param,
                       code="not_found")
    return conv


def append_items(state: WorkerState, conversation_id: str, items: list[dict[str, Any]]) -> None:
    """A finished response's input and output items join its conversation (if it is still stored)."""
    if (conv := state.conversations.get(conversation_id)) is not None:
        conv.items.extend(items)


async def create_conversation(state: WorkerState, body: bytes, receive, send) -> None:
    if not state.conversations.enabled:
        raise APIError(400, "Conversations are disabled on this server (its responses store is off).",
                       param="conversation")
    req = _decode(body)
    conv = Conversation(f"conv_{uuid.uuid4().hex}", int(time.time()), req.metadata or {}, req.items)
    state.conversations.put(conv.id, conv)
    await send_response(send, 200, msgspec.json.encode(conv.resource()))


def conversations_route(method: str, path: str, query: bytes = b"") -> Handler | None:
    """The handler for a path under /v1/conversations/{id}, or None."""
    if not path.startswith(PREFIX):
        return None
    parts = path[len(PREFIX):].split("/")
    routes = {(1, "GET"): _retrieve, (1, "POST"): _update, (1, "DELETE"): _delete,
              (2, "GET"): _list_items, (2, "POST"): _add_items, (3, "GET"): _get_item, (3, "DELETE"): _delete_item}
    target = routes.get((len(parts), method))
    if target is None or not parts[0] or (len(parts) > 1 and parts[1] != "items") or (len(parts) == 3 and not parts[2]):
        return None

    async def handler(state, body, receive, send):
        conv = conversation_or_404(state, parts[0])
        await target(state, conv, parts[2] if len(parts) == 3 else None, body, query, send)

    return handler


async def _retrieve(state, conv: Conversation, item_id, body, query, send) -> None:
    await send_response(send, 200, msgspec.json.encode(conv.resource()))


async def _update(state, conv: Conversation, item_id, body, query, send) -> None:
    req = _decode(body)
    if req.metadata is None:
        raise APIError(400, "`metadata` is required.", param="metadata")
    conv.metadata = req.metadata
    await send_response(send, 200, msgspec.json.encode(conv.resource()))


async def _delete(state, conv: Conversation, item_id, body, query, send) -> None:
    state.conversations.delete(conv.id)
    await send_response(send, 200, msgspec.json.encode({"id": conv.id, "object": "conversation.deleted",
                                                        "deleted": True}))


async def _add_items(state, conv: Conversation, item_id, body, query, send) -> None:
    req = _decode(body)
    if not req.items:
        raise APIError(400, "`items` must hold at least one item.", param="items")
    conv.items.extend(req.items)
    await send_response(send, 200, msgspec.json.encode(page(req.items, len(req.items))))


def _find(conv: Conversation, item_id: str) -> int:
    for i, item in enumerate(conv.items):
        if item["id"] == item_id:
            return i
    raise APIError(404, f"No item with id `{item_id}` in the conversation `{conv.id}`.", code="not_found")


async def _get_item(state, conv: Conversation, item_id, body, query, send) -> None:
    await send_response(send, 200, msgspec.json.encode(conv.items[_find(conv, item_id)]))


async def _delete_item(state, conv: Conversation, item_id, body, query, send) -> None:
    del conv.items[_find(conv, item_id)]
    await send_response(send, 200, msgspec.json.encode(conv.resource()))


async def _list_items(state, conv: Conversation, item_id, body, query, send) -> None:
    await send_response(send, 200, msgspec.json.encode(list_page(conv.items, query, conv.id)))


def page(items: list[dict], limit: int) -> dict:
    shown = items[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(items) > limit}


def list_page(all_items: list[dict], query: bytes, owner: str) -> dict:
    """OpenAI's list: `limit` (1 to 100, default 20), `order` (desc by default), `after` an item id."""
    args = {k: v[-1] for k, v in parse_qs(query.decode("latin-1")).items()}
    try:
        limit = int(args.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise APIError(400, "`limit` must be an integer from 1 to 100.", param="limit")
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, "`order` must be asc or desc.", param="order")
    items = all_items if order == "asc" else all_items[::-1]
    if (after := args.get("after")) is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise APIError(400, f"`after` names no item of `{owner}`.", param="after")
        items = items[ids.index(after) + 1:]
    return page(items, limit)
