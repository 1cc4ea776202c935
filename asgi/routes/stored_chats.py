"""OpenAI's stored Chat Completions: a completion created with `store: true` is kept (asgi/stores/chat_store.py),
then listed (GET /v1/chat/completions, by `model` and `metadata[key]=value`), read, its metadata replaced (POST),
deleted, and its request's messages listed (GET .../messages). A streamed completion is kept whole, as its chunks
put together. The store is written before the answer's last bytes go out, so a client that has read the end finds
it; a store that fails loses the record (a warning), never the answer."""
from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from rill.asgi.errors import APIError, not_found
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.chat_format import ChatFormatter
from rill.asgi.output.respond import BeforeLast
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.bounds import MAX_METADATA, MAX_NAME_LEN, Metadata
from rill.asgi.requests.schemas import ChatCompletionRequest, ChatMessage
from rill.asgi.routes.conversations import page, page_query
from rill.asgi.state import WorkerState
from rill.asgi.stores.base import Page, StoreUnavailable
from rill.asgi.stores.chat_store import ChatStore, StoredChat

log = logging.getLogger("rill.store")

METADATA_ARG = re.compile(r"metadata\[(.{1,64})\]", re.DOTALL)


def keeper(state: WorkerState, req: ChatCompletionRequest, fmt: ChatFormatter, gen) -> BeforeLast | None:
    """respond's `before_last` for a request with `store: true`: the whole completion into the store."""
    if not req.store or state.chats is None or not state.chats.bounds.enabled:
        return None
    fmt.keep_whole = True  # a stream's chunks are put together as they go

    async def keep(failed: bool) -> None:
        if failed or gen.disconnected:
            return
        completion = {**fmt.whole(gen.usage()), "metadata": req.metadata or {}}
        try:
            await state.chats.put(StoredChat(completion=completion, messages=stored_messages(completion["id"],
                                                                                              req.messages)))
        except StoreUnavailable as exc:
            log.warning("chat completion %s was not stored: %s", completion["id"], exc)
    return keep


def stored_messages(completion_id: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The request's messages as OpenAI lists them: each with an id, its text as `content` and, where it was sent
    as parts, its text and image parts as `content_parts`."""
    out = []
    for i, m in enumerate(messages):
        parts = m.content if isinstance(m.content, list) else None
        entry: dict[str, Any] = {
            "id": f"{completion_id}-{i}", "role": m.role, "name": m.name,
            "content": m.content if parts is None else "".join(p.text or "" for p in parts if p.type == "text"),
            "content_parts": None if parts is None else [_part(p) for p in parts if p.type in ("text", "image_url")]}
        if m.tool_calls:
            entry["tool_calls"] = [{"id": call.id or "", "type": call.type, "function": {
                "name": call.function.name, "arguments": call.function.arguments if isinstance(
                    call.function.arguments, str) else msgspec.json.encode(call.function.arguments or {}).decode()}}
                for call in m.tool_calls]
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        out.append(entry)
    return out


def _part(part) -> dict[str, Any]:
    if part.type == "text":
        return {"type": "text", "text": part.text or ""}
    image = {"url": part.image_url.url} if part.image_url else {"url": ""}
    if part.image_url and part.image_url.detail:
        image["detail"] = part.image_url.detail
    return {"type": "image_url", "image_url": image}


def _store(http: HTTPRequest) -> ChatStore:
    return http.state.chats


async def _stored(http: HTTPRequest) -> StoredChat:
    completion_id = http.params["completion_id"]
    record = await _store(http).get(completion_id)
    if record is None:
        why = " (the chat completions store is disabled on this server)" if not _store(http).bounds.enabled else \
            ": only a chat completion created with `store: true` is kept, until its TTL or the store's bounds end it"
        raise not_found(f"No stored chat completion `{completion_id[:MAX_NAME_LEN]}`{why}.", param="completion_id")
    return record


async def retrieve(http: HTTPRequest) -> None:
    await send_response(http.send, 200, msgspec.json.encode((await _stored(http)).completion))


class UpdateBody(msgspec.Struct):
    metadata: Metadata | None


_update_body = msgspec.json.Decoder(UpdateBody)


async def update(http: HTTPRequest) -> None:
    """Replaces the metadata (null: none), the only field OpenAI lets a client change."""
    metadata = decode_json(_update_body, http.body or b"{}").metadata or {}
    record = await _store(http).set_metadata(http.params["completion_id"], metadata)
    if record is None:
        await _stored(http)  # raises its 404, which says why
    await send_response(http.send, 200, msgspec.json.encode(record.completion))


async def delete(http: HTTPRequest) -> None:
    completion_id = http.params["completion_id"]
    if not await _store(http).delete(completion_id):
        await _stored(http)
    await send_response(http.send, 200, msgspec.json.encode(
        {"object": "chat.completion.deleted", "id": completion_id, "deleted": True}))


async def list_completions(http: HTTPRequest) -> None:
    """OpenAI's list: `model`, `metadata[key]=value` (every pair must match), `after`, `limit` (1 to 100, default
    20), `order` (asc by default, as OpenAI's)."""
    limit, order, after = page_query(http.query, default_order="asc")
    model, metadata = None, {}
    for key, value in parse_qsl(http.query.decode("latin-1")):
        if key == "model":
            model = value
        elif (m := METADATA_ARG.fullmatch(key)) is not None:
            metadata[m.group(1)] = value
    if len(metadata) > MAX_METADATA:
        raise APIError(400, f"`metadata` filters at most {MAX_METADATA} pairs.", param="metadata")
    got = await _store(http).list(model, metadata, limit, order, after)
    if got is None:
        raise APIError(400, "`after` names no stored chat completion.", param="after")
    await send_response(http.send, 200, msgspec.json.encode(page(Page(*got))))


async def list_messages(http: HTTPRequest) -> None:
    """The request's messages, a page at a time (asc by default, as OpenAI's)."""
    limit, order, after = page_query(http.query, default_order="asc")
    messages = (await _stored(http)).messages
    if order == "desc":
        messages = messages[::-1]
    start = 0 if after is None else next((i + 1 for i, m in enumerate(messages) if m["id"] == after), -1)
    if start < 0:
        raise APIError(400, "`after` names no message of this chat completion.", param="after")
    got = Page(messages[start:start + limit], start + limit < len(messages))
    await send_response(http.send, 200, msgspec.json.encode(page(got)))
