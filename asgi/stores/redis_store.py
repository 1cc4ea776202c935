"""The state store in Redis (redis-py's asyncio client): shared by several servers.

Keys, under a prefix (`rill:` by default), each namespace holding one kind of key, so that no id,
whatever it holds, can name another kind's key or an internal one:
- `resp:<id>`: a response's JSON; `resp-items:<id>` its input items (a list of JSON) and
  `resp-item-ids:<id>` their ids (a list in the same order, to find `after` without reading items);
- `conv:<id>`, `conv-items:<id>`, `conv-item-ids:<id>`: a conversation the same way;
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

log = logging.getLogger("rill.store")

# Every script gets KEYS: index, bytes, total of the kind; ARGV[1..3]: the key prefixes of an
# entry, its items and its item ids; ARGV[4]: the id; ARGV[5..7]: ttl_ms, max_entries, max_bytes.
_COMMON = """
local A, B, C, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop(old)
  local existed = redis.call('DEL', A .. old, B .. old, C .. old)
  redis.call('ZREM', KEYS[1], old)
  local size = tonumber(redis.call('HGET', KEYS[2], old) or '0')
  redis.call('HDEL', KEYS[2], old)
  if size ~= 0 then redis.call('DECRBY', KEYS[3], size) end
  return existed
end
local function resize(delta)
  redis.call('HINCRBY', KEYS[2], id, delta)
  redis.call('INCRBY', KEYS[3], delta)
end
-- What is past its TTL leaves the index and the sizes (its keys expired on their own), then the
-- oldest go while the count or the total bytes is past its bound; never `id` itself.
local function evict()
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms() - tonumber(ARGV[5]))) do
    if old ~= id then drop(old) end
  end
  while redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[6])
      or tonumber(redis.call('GET', KEYS[3]) or '0') > tonumber(ARGV[7]) do
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 1)
    local victim = oldest[1]
    if victim == id then victim = oldest[2] end
    if not victim then break end
    drop(victim)
  end
end
-- ARGV from `first` on: item id, item JSON, item id, ...
local function push(first, ttl)
  if #ARGV < first then return end
  for i = first, #ARGV, 2 do
    redis.call('RPUSH', C .. id, ARGV[i])
    redis.call('RPUSH', B .. id, ARGV[i + 1])
  end
  redis.call('PEXPIRE', B .. id, ttl)
  redis.call('PEXPIRE', C .. id, ttl)
end
"""
# ARGV[8]: the body, ARGV[9]: the entry's bytes, then the items. The TTL counts from now.
_PUT_RESPONSE = _COMMON + """
local old = tonumber(redis.call('HGET', KEYS[2], id) or '0')
redis.call('DEL', B .. id, C .. id)
redis.call('SET', A .. id, ARGV[8], 'PX', ARGV[5])
push(10, ARGV[5])
redis.call('ZADD', KEYS[1], now_ms(), id)
resize(tonumber(ARGV[9]) - old)
evict()
"""
# ARGV[8]: the body, ARGV[9]: its bytes and the items', then the items. Creates (indexed by now)
# or updates the metadata (keeps the TTL and the items).
_PUT_CONVERSATION = _COMMON + """
if redis.call('EXISTS', A .. id) == 1 then
  local old = redis.call('STRLEN', A .. id)
  redis.call('SET', A .. id, ARGV[8], 'KEEPTTL')
  resize(string.len(ARGV[8]) - old)
  evict()
  return 0
end
redis.call('SET', A .. id, ARGV[8], 'PX', ARGV[5])
push(10, ARGV[5])
redis.call('ZADD', KEYS[1], now_ms(), id)
resize(tonumber(ARGV[9]))
evict()
return 1
"""
# ARGV[8]: max items, ARGV[9]: max bytes of a conversation, ARGV[10]: the items' bytes, then the
# items. 1 added, 0 gone, -1 too many items, -2 too many bytes. The items expire with the conversation.
_ADD_ITEMS = _COMMON + """
local ttl = redis.call('PTTL', A .. id)
if ttl <= 0 then return 0 end
if redis.call('LLEN', C .. id) + (#ARGV - 10) / 2 > tonumber(ARGV[8]) then return -1 end
if tonumber(redis.call('HGET', KEYS[2], id) or '0') + tonumber(ARGV[10]) > tonumber(ARGV[9]) then return -2 end
push(11, ttl)
resize(tonumber(ARGV[10]))
evict()
return 1
"""
_DELETE = _COMMON + "return drop(id)"
# ARGV[5]: the item id. Removes the first item with that id (an emptied slot, then LREM of it:
# no id or item JSON is empty).
_DELETE_ITEM = _COMMON + """
local at = redis.call('LPOS', C .. id, ARGV[5])
if not at then return 0 end
local raw = redis.call('LINDEX', B .. id, at)
for _, key in ipairs({B .. id, C .. id}) do
  redis.call('LSET', key, at, '')
  redis.call('LREM', key, 1, '')
end
resize(-string.len(raw))
return 1
"""
# KEYS: the entry, its items, their ids; ARGV: limit, order, after (empty: none).
# {-1}: the entry is gone; {-2}: `after` is not among the ids; else {has_more, items...}.
_PAGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local limit, asc = tonumber(ARGV[1]), ARGV[2] == 'asc'
local first, last = 0, redis.call('LLEN', KEYS[3]) - 1
if ARGV[3] ~= '' then
  local at = redis.call('LPOS', KEYS[3], ARGV[3])
  if not at then return {-2} end
  if asc then first = at + 1 else last = at - 1 end
end
local got
if asc then
  got = redis.call('LRANGE', KEYS[2], first, first + limit)
else
  if last < 0 then return {0} end
  got = redis.call('LRANGE', KEYS[2], math.max(0, last - limit), last)
  local n = #got
  for i = 1, math.floor(n / 2) do got[i], got[n + 1 - i] = got[n + 1 - i], got[i] end
end
local page = {#got > limit and 1 or 0}
for i = 1, math.min(#got, limit) do page[i + 1] = got[i] end
return page
"""
# KEYS: the entry, its items, their ids; ARGV: the item id. The item, or nil.
_GET_ITEM = """
local at = redis.call('LPOS', KEYS[3], ARGV[1])
if not at then return false end
return redis.call('LINDEX', KEYS[2], at)
"""


class _Kind:
    def __init__(self, prefix: str, name: str):
        self.entry, self.items, self.item_ids = f"{prefix}{name}:", f"{prefix}{name}-items:", f"{prefix}{name}-item-ids:"
        self.index, self.bytes, self.total = f"{prefix}index:{name}", f"{prefix}bytes:{name}", f"{prefix}total:{name}"

    def keys(self) -> list[str]:
        return [self.index, self.bytes, self.total]

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
        self._put_response_script, self._put_conversation_script = script(_PUT_RESPONSE), script(_PUT_CONVERSATION)
        self._add_items_script, self._delete_script = script(_ADD_ITEMS), script(_DELETE)
        self._delete_item_script, self._page_script, self._get_item_script = \
            script(_DELETE_ITEM), script(_PAGE), script(_GET_ITEM)

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
