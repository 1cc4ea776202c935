"""The state store in Redis (redis-py's asyncio client): shared by several servers.

Keys, under a prefix (`rill:` by default):
- `resp:<id>`: a response's JSON, expiring with its TTL; `resp:index`: a sorted set of ids by
  write time, for the count bound;
- `conv:<id>`: a conversation's JSON and `conv:<id>:items`: its items (a list of JSON), both
  expiring with the conversation's TTL; `conv:index`: ids by creation time.
Each write and its eviction run in one Lua script, so the bounds hold across servers and a
bounded store never grows past them.
"""
from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from asgi.stores.base import (
    Bounds,
    Conversation,
    StateStore,
    StoredResponse,
    StoreUnavailable,
    conversation_decoder,
    encode,
    item_decoder,
    response_decoder,
)

log = logging.getLogger("rill.store")

# KEYS: index; ARGV: prefix, id, body, ttl_ms, max_entries, extra key suffix to drop with an entry.
# The write and then: ids older than the TTL leave the index (their keys expire on their own),
# then the oldest beyond the count go, keys and all.
_EVICT = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - tonumber(ARGV[4]))
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[5])
if extra > 0 then
  for _, old in ipairs(redis.call('ZRANGE', KEYS[1], 0, extra - 1)) do
    redis.call('DEL', ARGV[1] .. old, ARGV[1] .. old .. ARGV[6])
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1)
end
"""
_PUT_RESPONSE = """
local now = redis.call('TIME')
redis.call('SET', ARGV[1] .. ARGV[2], ARGV[3], 'PX', ARGV[4])
redis.call('ZADD', KEYS[1], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), ARGV[2])
""" + _EVICT
# ARGV as above, then the items' JSON. Creates (index by now) or updates (keeps the TTL) a conversation.
_PUT_CONVERSATION = """
local key = ARGV[1] .. ARGV[2]
if redis.call('EXISTS', key) == 1 then
  redis.call('SET', key, ARGV[3], 'KEEPTTL')
  return 0
end
local now = redis.call('TIME')
redis.call('SET', key, ARGV[3], 'PX', ARGV[4])
redis.call('ZADD', KEYS[1], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), ARGV[2])
if #ARGV > 6 then
  redis.call('RPUSH', key .. ARGV[6], unpack(ARGV, 7))
  redis.call('PEXPIRE', key .. ARGV[6], ARGV[4])
end
""" + _EVICT + "return 1"
# KEYS: conversation, its items; ARGV: the items' JSON. The items expire with the conversation.
_ADD_ITEMS = """
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then return 0 end
redis.call('RPUSH', KEYS[2], unpack(ARGV))
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"""
# KEYS: the items list; ARGV: an item id. Removes the first item with that id.
_DELETE_ITEM = """
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if cjson.decode(raw)['id'] == ARGV[1] then
    redis.call('LREM', KEYS[1], 1, raw)
    return 1
  end
end
return 0
"""
_ITEMS = ":items"


class RedisStore(StateStore):
    def __init__(self, url: str, responses: Bounds, conversations: Bounds, prefix: str = "rill:"):
        super().__init__(responses, conversations)
        self.url = url
        self.prefix = prefix
        self._redis = aioredis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)
        self._put_response = self._redis.register_script(_PUT_RESPONSE)
        self._put_conversation = self._redis.register_script(_PUT_CONVERSATION)
        self._add_items = self._redis.register_script(_ADD_ITEMS)
        self._delete_item = self._redis.register_script(_DELETE_ITEM)

    async def _call(self, awaitable) -> Any:
        try:
            return await awaitable
        except (RedisError, OSError) as exc:
            log.error("the state store at %s failed: %s", _without_password(self.url), exc)
            raise StoreUnavailable(f"the state store failed ({type(exc).__name__}: {exc})") from None

    @staticmethod
    def _ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    # ---- responses ----
    async def put_response(self, record: StoredResponse) -> None:
        bounds = self.responses
        await self._call(self._put_response(keys=[self.prefix + "resp:index"], args=[
            self.prefix + "resp:", record.id, encode(record), self._ms(bounds.ttl_s), bounds.max_entries, ""]))

    async def get_response(self, response_id: str) -> StoredResponse | None:
        raw = await self._call(self._redis.get(f"{self.prefix}resp:{response_id}"))
        return response_decoder.decode(raw) if raw is not None else None

    async def delete_response(self, response_id: str) -> bool:
        removed = await self._call(self._redis.delete(f"{self.prefix}resp:{response_id}"))
        await self._call(self._redis.zrem(self.prefix + "resp:index", response_id))
        return removed > 0

    # ---- conversations ----
    async def put_conversation(self, conv: Conversation, items: list[dict[str, Any]] | None = None) -> None:
        bounds = self.conversations
        await self._call(self._put_conversation(keys=[self.prefix + "conv:index"], args=[
            self.prefix + "conv:", conv.id, encode(conv), self._ms(bounds.ttl_s), bounds.max_entries, _ITEMS,
            *(encode(item) for item in items or [])]))

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        raw = await self._call(self._redis.get(f"{self.prefix}conv:{conversation_id}"))
        return conversation_decoder.decode(raw) if raw is not None else None

    async def delete_conversation(self, conversation_id: str) -> bool:
        key = f"{self.prefix}conv:{conversation_id}"
        removed = await self._call(self._redis.delete(key, key + _ITEMS))
        await self._call(self._redis.zrem(self.prefix + "conv:index", conversation_id))
        return removed > 0

    async def add_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        if not items:
            return await self.get_conversation(conversation_id) is not None
        key = f"{self.prefix}conv:{conversation_id}"
        return bool(await self._call(self._add_items(keys=[key, key + _ITEMS], args=[encode(i) for i in items])))

    async def list_items(self, conversation_id: str) -> list[dict[str, Any]] | None:
        key = f"{self.prefix}conv:{conversation_id}"
        async with self._redis.pipeline(transaction=True) as pipe:
            exists, raw_items = await self._call(pipe.exists(key).lrange(key + _ITEMS, 0, -1).execute())
        return [item_decoder.decode(raw) for raw in raw_items] if exists else None

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        key = f"{self.prefix}conv:{conversation_id}{_ITEMS}"
        return bool(await self._call(self._delete_item(keys=[key], args=[item_id])))

    async def close(self) -> None:
        try:
            await self._redis.aclose()
        except (RedisError, OSError):
            pass


def _without_password(url: str) -> str:
    """redis://user:secret@host → redis://user:***@host, for the logs."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"
