"""The state store in Redis (redis-py's asyncio client): shared by several servers.

Keys, under a prefix (`rill:` by default), each namespace holding one kind of key, so that no id,
whatever it holds, can name another kind's key or an internal one:
- `resp:<id>`: a response's JSON; `resp-items:<id>` its input items (a list of JSON) and
  `resp-item-ids:<id>` their ids (a list in the same order, to find `after` without reading items);
- `conv:<id>`, `conv-items:<id>`, `conv-item-ids:<id>`: a conversation the same way;
- `resp-events:<id>`: a streamed background response's events (a list of SSE frames, index = sequence
  number), and `event-bytes:resp` their size for each response (part of its size);
- `index:resp`, `index:conv`: ids by write (responses) or creation (conversations) time, for the
  count bound; `bytes:resp`, `bytes:conv`: each entry's size; `total:resp`, `total:conv` their sum.
An entry's keys expire with its TTL. Each write and its eviction run in one Lua script, so the
bounds hold across servers and a bounded store never grows past them; lists read a page with
LRANGE in a script, never the whole list.
"""
from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from rill.asgi.stores.base import (
    MAX_CONVERSATION_ITEMS,
    AddResult,
    AfterNotFound,
    Bounds,
    Order,
    StateStore,
    StoreUnavailable,
)
from rill.asgi.stores.redis_scripts import (
    ADD_ITEMS,
    APPEND_EVENTS,
    DELETE,
    DELETE_ITEM,
    GET_ITEM,
    PAGE,
    PUT_CONVERSATION,
    PUT_RESPONSE,
)

log = logging.getLogger("rill.store")

class _Kind:
    def __init__(self, prefix: str, name: str):
        self.entry, self.items, self.item_ids = f"{prefix}{name}:", f"{prefix}{name}-items:", f"{prefix}{name}-item-ids:"
        self.index, self.bytes, self.total = f"{prefix}index:{name}", f"{prefix}bytes:{name}", f"{prefix}total:{name}"
        self.events, self.event_bytes = f"{prefix}{name}-events:", f"{prefix}event-bytes:{name}"

    def keys(self) -> list[str]:
        return [self.index, self.bytes, self.total, self.events, self.event_bytes]

    def entry_keys(self, entry_id: str) -> list[str]:
        return [self.entry + entry_id, self.items + entry_id, self.item_ids + entry_id]

    def args(self, entry_id: str, bounds: Bounds | None = None) -> list[Any]:
        limits = [_ms(bounds.ttl_s), bounds.max_entries, bounds.max_bytes] if bounds else [0, 0, 0]
        return [self.entry, self.items, self.item_ids, entry_id, *limits]


class RedisStore(StateStore):
    def __init__(self, url: str, responses: Bounds, conversations: Bounds, prefix: str = "rill:"):
        super().__init__(responses, conversations)
        self.url = url
        self.prefix = prefix
        self._resp, self._conv = _Kind(prefix, "resp"), _Kind(prefix, "conv")
        self._redis = aioredis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)
        script = self._redis.register_script
        self._put_response_script, self._put_conversation_script = script(PUT_RESPONSE), script(PUT_CONVERSATION)
        self._add_items_script, self._delete_script = script(ADD_ITEMS), script(DELETE)
        self._delete_item_script, self._page_script, self._get_item_script = \
            script(DELETE_ITEM), script(PAGE), script(GET_ITEM)
        self._append_events_script = script(APPEND_EVENTS)

    async def _call(self, awaitable) -> Any:
        try:
            return await awaitable
        except (RedisError, OSError) as exc:
            log.error("the state store at %s failed: %s", _without_password(self.url), exc)
            raise StoreUnavailable(f"the state store failed ({type(exc).__name__}: {exc})") from None

    # ---- responses ----
    async def _put_response(self, response_id: str, body: bytes, items: list[tuple[str, bytes]],
                            num_bytes: int) -> None:
        kind = self._resp
        await self._call(self._put_response_script(keys=kind.keys(), args=[
            *kind.args(response_id, self.responses), body, num_bytes, *_flat(items)]))

    async def _get_response(self, response_id: str) -> bytes | None:
        return await self._call(self._redis.get(self._resp.entry + response_id))

    async def _delete_response(self, response_id: str) -> bool:
        return await self._call(self._delete_script(keys=self._resp.keys(), args=self._resp.args(response_id))) > 0

    async def _page_response_items(self, response_id: str, limit: int, order: Order,
                                   after: str | None) -> tuple[list[bytes], bool] | None:
        return await self._page(self._resp, response_id, limit, order, after)

    async def _append_events(self, response_id: str, first: int, events: list[bytes], num_bytes: int) -> bool:
        kind = self._resp
        return await self._call(self._append_events_script(keys=kind.keys(), args=[
            *kind.args(response_id, self.responses), self.responses.max_entry_bytes, first, num_bytes, *events])) == 1

    async def _read_events(self, response_id: str, after: int, limit: int) -> list[bytes] | None:
        async with self._redis.pipeline(transaction=True) as pipe:
            exists, events = await self._call(pipe.exists(self._resp.entry + response_id).lrange(
                self._resp.events + response_id, after + 1, after + limit).execute())
        return list(events) if exists else None

    async def _page(self, kind: _Kind, owner_id: str, limit: int, order: Order,
                    after: str | None) -> tuple[list[bytes], bool] | None:
        got = await self._call(self._page_script(keys=kind.entry_keys(owner_id), args=[limit, order, after or ""]))
        if got[0] == -1:
            return None
        if got[0] == -2:
            raise AfterNotFound
        return list(got[1:]), got[0] == 1

    # ---- conversations ----
    async def _put_conversation(self, conversation_id: str, body: bytes, items: list[tuple[str, bytes]]) -> None:
        kind = self._conv
        await self._call(self._put_conversation_script(keys=kind.keys(), args=[
            *kind.args(conversation_id, self.conversations), body,
            len(body) + sum(len(raw) for _, raw in items), *_flat(items)]))

    async def _get_conversation(self, conversation_id: str) -> bytes | None:
        return await self._call(self._redis.get(self._conv.entry + conversation_id))

    async def _delete_conversation(self, conversation_id: str) -> bool:
        return await self._call(self._delete_script(keys=self._conv.keys(),
                                                    args=self._conv.args(conversation_id))) > 0

    async def _add_items(self, conversation_id: str, items: list[tuple[str, bytes]]) -> AddResult:
        kind = self._conv
        result = await self._call(self._add_items_script(keys=kind.keys(), args=[
            *kind.args(conversation_id, self.conversations), MAX_CONVERSATION_ITEMS,
            self.conversations.max_entry_bytes, sum(len(raw) for _, raw in items), *_flat(items)]))
        return {1: "added", 0: "gone", -1: "too_many_items", -2: "too_many_bytes"}[result]

    async def _all_items(self, conversation_id: str) -> list[bytes] | None:
        entry, items, _ = self._conv.entry_keys(conversation_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            exists, raw_items = await self._call(pipe.exists(entry).lrange(items, 0, -1).execute())
        return list(raw_items) if exists else None

    async def _page_items(self, conversation_id: str, limit: int, order: Order,
                          after: str | None) -> tuple[list[bytes], bool] | None:
        return await self._page(self._conv, conversation_id, limit, order, after)

    async def _get_item(self, conversation_id: str, item_id: str) -> bytes | None:
        return await self._call(self._get_item_script(keys=self._conv.entry_keys(conversation_id), args=[item_id]))

    async def _delete_item(self, conversation_id: str, item_id: str) -> bool:
        kind = self._conv
        return bool(await self._call(self._delete_item_script(keys=kind.keys(), args=[
            *kind.args(conversation_id)[:4], item_id])))

    async def close(self) -> None:
        try:
            await self._redis.aclose()
        except (RedisError, OSError):
            pass


def _flat(items: list[tuple[str, bytes]]) -> list[Any]:
    return [part for pair in items for part in pair]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _without_password(url: str) -> str:
    """redis://user:secret@host → redis://user:***@host, for the logs."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"
