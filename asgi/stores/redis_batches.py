"""The Batch API's records in the Redis state store, under the store's prefix and on its client.

Keys: `file:<id>` (a file's JSON), `files` and `files:<purpose>` (ids by upload order, scored by
`files-seq`); `batch:<id>` (a batch's JSON), `batch-status` (id -> status, for compare-and-set),
`batches` (ids by creation, scored by `batches-seq`), `batch-lease:<id>` (the owner, expiring
with the lease). Every write that checks something runs in one Lua script, so bounds and leases
hold across servers.
"""
from __future__ import annotations

from rill.asgi.stores.batch_store import ACTIVE_VALUES, FINAL, BatchStore, Order, RecordPage
from rill.asgi.stores.redis_store import RedisStore

# KEYS: files, files:<purpose>, files-seq, file:<id>; ARGV: id, body, max files (-1: none).
_ADD_FILE = """
if tonumber(ARGV[3]) >= 0 and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
local seq = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[1], seq, ARGV[1])
redis.call('ZADD', KEYS[2], seq, ARGV[1])
return 1
"""
# KEYS: files, files:<purpose>..., file:<id>; ARGV: id.
_DELETE_FILE = """
local found = redis.call('DEL', KEYS[#KEYS])
for i = 1, #KEYS - 1 do redis.call('ZREM', KEYS[i], ARGV[1]) end
return found
"""
# KEYS: the index to read (a zset), the index `after` is looked up in; ARGV: record key prefix,
# limit, order, after ('' for none). {-1}: `after` is unknown; else {has_more, bodies...}.
_PAGE = """
local limit = tonumber(ARGV[2])
local ids
if ARGV[4] == '' then
  if ARGV[3] == 'asc' then ids = redis.call('ZRANGE', KEYS[1], 0, limit)
  else ids = redis.call('ZREVRANGE', KEYS[1], 0, limit) end
else
  local score = redis.call('ZSCORE', KEYS[2], ARGV[4])
  if not score then return {-1} end
  if ARGV[3] == 'asc' then ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. score, '+inf', 'LIMIT', 0, limit + 1)
  else ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. score, '-inf', 'LIMIT', 0, limit + 1) end
end
local page = {#ids > limit and 1 or 0}
for i = 1, math.min(#ids, limit) do
  local body = redis.call('GET', ARGV[1] .. ids[i])
  if body then page[#page + 1] = body end
end
return page
"""
# KEYS: batches, batch-status, batches-seq; ARGV: record prefix, id, status, body, max batches, final statuses...
_ADD_BATCH = """
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[5]) then
  local final = {}
  for i = 6, #ARGV do final[ARGV[i]] = true end
  local victim
  for _, old in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if final[redis.call('HGET', KEYS[2], old)] then victim = old break end
  end
  if not victim then return 0 end
  redis.call('DEL', ARGV[1] .. victim)
  redis.call('HDEL', KEYS[2], victim)
  redis.call('ZREM', KEYS[1], victim)
end
redis.call('SET', ARGV[1] .. ARGV[2], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[3]), ARGV[2])
return 1
"""
# KEYS: batch-status, batch:<id>; ARGV: id, status, body, expected statuses...
_UPDATE_BATCH = """
local now = redis.call('HGET', KEYS[1], ARGV[1])
if not now then return 0 end
for i = 4, #ARGV do
  if ARGV[i] == now then
    redis.call('SET', KEYS[2], ARGV[3])
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    return 1
  end
end
return 0
"""
# KEYS: batches, batch-status; ARGV: lease key prefix, owner, lease ms, active statuses...
_CLAIM = """
local active = {}
for i = 4, #ARGV do active[ARGV[i]] = true end
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if active[redis.call('HGET', KEYS[2], id)] and redis.call('SET', ARGV[1] .. id, ARGV[2], 'NX', 'PX', ARGV[3]) then
    return id
  end
end
return false
"""
# KEYS: batch-lease:<id>; ARGV: owner, lease ms (0: release).
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) else redis.call('DEL', KEYS[1]) end
return 1
"""
PURPOSES = ("batch", "batch_output")


class RedisBatches(BatchStore):
    def __init__(self, store: RedisStore):
        self.store = store
        p = store.prefix
        self.file, self.files, self.files_seq = f"{p}file:", f"{p}files", f"{p}files-seq"
        self.batch, self.batches, self.batches_seq = f"{p}batch:", f"{p}batches", f"{p}batches-seq"
        self.status, self.lease = f"{p}batch-status", f"{p}batch-lease:"
        script = store._redis.register_script
        self._add_file_script, self._delete_file_script, self._page_script = \
            script(_ADD_FILE), script(_DELETE_FILE), script(_PAGE)
        self._add_batch_script, self._update_script = script(_ADD_BATCH), script(_UPDATE_BATCH)
        self._claim_script, self._renew_script = script(_CLAIM), script(_RENEW)

    def _call(self, awaitable):
        return self.store._call(awaitable)

    async def _add_file(self, file_id: str, created_at: int, purpose: str, body: bytes,
                        max_files: int | None) -> bool:
        return bool(await self._call(self._add_file_script(
            keys=[self.files, f"{self.files}:{purpose}", self.files_seq, self.file + file_id],
            args=[file_id, body, -1 if max_files is None else max_files])))

    async def _get_file(self, file_id: str) -> bytes | None:
        return await self._call(self.store._redis.get(self.file + file_id))

    async def _delete_file(self, file_id: str) -> bool:
        keys = [self.files, *(f"{self.files}:{p}" for p in PURPOSES), self.file + file_id]
        return bool(await self._call(self._delete_file_script(keys=keys, args=[file_id])))

    async def _list_files(self, purpose: str | None, limit: int, order: Order,
                          after: str | None) -> RecordPage | None:
        index = f"{self.files}:{purpose}" if purpose is not None else self.files
        return await self._page([index, self.files], self.file, limit, order, after)

    async def _page(self, keys: list[str], prefix: str, limit: int, order: Order, after: str | None):
        got = await self._call(self._page_script(keys=keys, args=[prefix, limit, order, after or ""]))
        if got[0] == -1:
            return None
        return RecordPage(list(got[1:]), got[0] == 1)

    async def _add_batch(self, batch_id: str, status: str, body: bytes, max_batches: int) -> bool:
        return bool(await self._call(self._add_batch_script(
            keys=[self.batches, self.status, self.batches_seq],
            args=[self.batch, batch_id, status, body, max_batches, *FINAL])))

    async def _get_batch(self, batch_id: str) -> bytes | None:
        return await self._call(self.store._redis.get(self.batch + batch_id))

    async def _list_batches(self, limit: int, after: str | None) -> RecordPage | None:
        return await self._page([self.batches, self.batches], self.batch, limit, "desc", after)

    async def _update_batch(self, batch_id: str, status: str, body: bytes, expected: tuple[str, ...]) -> bool:
        return bool(await self._call(self._update_script(keys=[self.status, self.batch + batch_id],
                                                         args=[batch_id, status, body, *expected])))

    async def _claim_batch(self, owner: str, lease_s: float) -> str | None:
        got = await self._call(self._claim_script(keys=[self.batches, self.status],
                                                  args=[self.lease, owner, _ms(lease_s), *ACTIVE_VALUES]))
        return got.decode() if isinstance(got, bytes) else got

    async def _renew_lease(self, batch_id: str, owner: str, lease_s: float) -> bool:
        return bool(await self._call(self._renew_script(keys=[self.lease + batch_id],
                                                        args=[owner, _ms(lease_s) if lease_s > 0 else 0])))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
