"""OpenAI's Conversations: items kept per conversation in the worker's memory, and their routes.

A response created with `conversation` reads the conversation's items before its input, and
when it ends its input and output items are appended. Conversations live in their own store,
bounded like the responses' one, and, like it, in one API worker process.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import msgspec

from asgi.errors import APIError
from asgi.http.primitives import send_response
from asgi.http.router import HTTPRequest
from asgi.requests.body import decode_json
from asgi.requests.responses_input import items_to_messages, typed_items
from asgi.requests.responses_request import check_metadata
from asgi.state import WorkerState

MAX_ITEMS_PER_CALL = 20  # as OpenAI: items of one create call


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


async def create(http: HTTPRequest) -> None:
    state = http.state
    if not state.conversations.enabled:
        raise APIError(400, "Conversations are disabled on this server (its responses store is off).",
                       param="conversation")
    req = _decode(http.body)
    conv = Conversation(f"conv_{uuid.uuid4().hex}", int(time.time()), req.metadata or {}, req.items)
    state.conversations.put(conv.id, conv)
    await send_response(http.send, 200, msgspec.json.encode(conv.resource()))


def _conversation(http: HTTPRequest) -> Conversation:
    return conversation_or_404(http.state, http.params["conversation_id"])


async def retrieve(http: HTTPRequest) -> None:
    await send_response(http.send, 200, msgspec.json.encode(_conversation(http).resource()))


async def update(http: HTTPRequest) -> None:
    conv = _conversation(http)
    req = _decode(http.body)
    if req.metadata is None:
        raise APIError(400, "`metadata` is required.", param="metadata")
    conv.metadata = req.metadata
    await send_response(http.send, 200, msgspec.json.encode(conv.resource()))


async def delete(http: HTTPRequest) -> None:
    conv = _conversation(http)
    http.state.conversations.delete(conv.id)
    await send_response(http.send, 200, msgspec.json.encode({"id": conv.id, "object": "conversation.deleted",
                                                             "deleted": True}))


async def add_items(http: HTTPRequest) -> None:
    conv = _conversation(http)
    req = _decode(http.body)
    if not req.items:
        raise APIError(400, "`items` must hold at least one item.", param="items")
    conv.items.extend(req.items)
    await send_response(http.send, 200, msgspec.json.encode(page(req.items, len(req.items))))


def _find(conv: Conversation, item_id: str) -> int:
    for i, item in enumerate(conv.items):
        if item["id"] == item_id:
            return i
    raise APIError(404, f"No item with id `{item_id}` in the conversation `{conv.id}`.", code="not_found")


async def get_item(http: HTTPRequest) -> None:
    conv = _conversation(http)
    await send_response(http.send, 200, msgspec.json.encode(conv.items[_find(conv, http.params["item_id"])]))


async def delete_item(http: HTTPRequest) -> None:
    conv = _conversation(http)
    del conv.items[_find(conv, http.params["item_id"])]
    await send_response(http.send, 200, msgspec.json.encode(conv.resource()))


async def list_items(http: HTTPRequest) -> None:
    conv = _conversation(http)
    await send_response(http.send, 200, msgspec.json.encode(list_page(conv.items, http.query, conv.id)))


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
