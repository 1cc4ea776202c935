"""Stored Chat Completions in the Redis state store, under the store's prefix and on its client.

Keys: `chat:<id>` (a record's JSON, expiring with its TTL), `chat-index` (id -> its model and metadata),
`index:chat` (ids by creation time, and by `chat-seq` within a millisecond), `bytes:chat` (each one's size) and `total:chat` (their sum). A write and its
eviction run in one Lua script, so the bounds hold across servers; a list reads the live ids and their index in one
script, then only its page's records.
"""
from __future__ import annotations

from rill.asgi.stores.base import Bounds
from rill.asgi.stores.chat_store import ChatStore, Order
from rill.asgi.stores.redis_store import RedisStore, _ms

# KEYS: index:chat, bytes:chat, total:chat, chat-index, chat-seq; ARGV[1]: the record key prefix, ARGV[2]: the id.
_COMMON = """
local A, id = ARGV[1], ARGV[2]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop(old)
  local existed = redis.call('DEL', A .. old)
  redis.call('ZREM', KEYS[1], old)
  redis.call('HDEL', KEYS[4], old)
  local size = tonumber(redis.call('HGET', KEYS[2], old) or '0')
  redis.call('HDEL', KEYS[2], old)
  if size ~= 0 then redis.call('DECRBY', KEYS[3], size) end
  return existed
end
local function resize(size)
  redis.call('INCRBY', KEYS[3], size - tonumber(redis.call('HGET', KEYS[2], id) or '0'))
  redis.call('HSET', KEYS[2], id, size)
end
"""
# ARGV[3..5]: ttl_ms, max_entries, max_bytes; ARGV[6]: the record, ARGV[7]: its index.
_PUT = _COMMON + """
local ttl = tonumber(ARGV[3])
redis.call('SET', A .. id, ARGV[6], 'PX', ttl)
redis.call('HSET', KEYS[4], id, ARGV[7])
-- Creation order within a millisecond too: a count (chat-seq) as the score's fraction, 1/4096 of a millisecond a step.
redis.call('ZADD', KEYS[1], now_ms() + (redis.call('INCR', KEYS[5]) % 4096) / 4096, id)
resize(string.len(ARGV[6]) + string.len(ARGV[7]))
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms() - ttl)) do
  if old ~= id then drop(old) end
end
while redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[4]) or tonumber(redis.call('GET', KEYS[3]) or '0') > tonumber(ARGV[5]) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 1)
  local victim = oldest[1]
  if victim == id then victim = oldest[2] end
  if not victim then break end
  drop(victim)
end
"""
# ARGV[3]: the record, ARGV[4]: its index. 1 rewritten (its TTL kept), 0 gone.
_REPLACE = _COMMON + """
if redis.call('EXISTS', A .. id) == 0 then return 0 end
redis.call('SET', A .. id, ARGV[3], 'KEEPTTL')
redis.call('HSET', KEYS[4], id, ARGV[4])
resize(string.len(ARGV[3]) + string.len(ARGV[4]))
return 1
"""
_DELETE = _COMMON + "return drop(id)"
# ARGV[3]: ttl_ms, ARGV[4]: asc or desc. The live ids and their index: id, index, id, index, ...
_IDS = _COMMON + """
local born = '(' .. (now_ms() - tonumber(ARGV[3]))
local ids
if ARGV[4] == 'asc' then ids = redis.call('ZRANGEBYSCORE', KEYS[1], born, '+inf')
else ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', born) end
local out = {}
for _, cid in ipairs(ids) do
  local index = redis.call('HGET', KEYS[4], cid)
  if index then out[#out + 1] = cid; out[#out + 1] = index end
end
return out
"""


class RedisChats(ChatStore):
    def __init__(self, store: RedisStore, bounds: Bounds):
        super().__init__(bounds)
        self.store = store
        prefix = store.prefix
        self._entry = f"{prefix}chat:"
        self._keys = [f"{prefix}index:chat", f"{prefix}bytes:chat", f"{prefix}total:chat", f"{prefix}chat-index",
                      f"{prefix}chat-seq"]
        script = store._redis.register_script
        self._put_script, self._replace_script = script(_PUT), script(_REPLACE)
        self._delete_script, self._ids_script = script(_DELETE), script(_IDS)

    async def _put(self, completion_id: str, body: bytes, index: bytes) -> None:
        b = self.bounds
        await self.store._call(self._put_script(keys=self._keys, args=[
            self._entry, completion_id, _ms(b.ttl_s), b.max_entries, b.max_bytes, body, index]))

    async def _get(self, completion_id: str) -> bytes | None:
        return await self.store._call(self.store._redis.get(self._entry + completion_id))

    async def _replace(self, completion_id: str, body: bytes, index: bytes) -> bool:
        return await self.store._call(self._replace_script(keys=self._keys, args=[
            self._entry, completion_id, body, index])) == 1

    async def _delete(self, completion_id: str) -> bool:
        return await self.store._call(self._delete_script(keys=self._keys, args=[self._entry, completion_id])) > 0

    async def _ids(self, order: Order) -> list[tuple[str, bytes]]:
        flat = await self.store._call(self._ids_script(keys=self._keys, args=[
            self._entry, "", _ms(self.bounds.ttl_s), order]))
        return [(flat[i].decode(), flat[i + 1]) for i in range(0, len(flat), 2)]

    async def _bodies(self, ids: list[str]) -> list[bytes | None]:
        return list(await self.store._call(self.store._redis.mget([self._entry + cid for cid in ids]))) if ids else []
